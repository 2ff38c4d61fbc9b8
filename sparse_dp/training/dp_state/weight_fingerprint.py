"""A fingerprint of the private weights that only the DP step's updates keep current.

``s(w) = sum_v sum_{i,j} r_v(i, j) w_v[i, j]`` (float64), with signs ``r_v(i, j) = +-1`` from
an integer hash of (variable, row, column). The DP step keeps ``s`` current at the cost of its
update: it reads the rows it updates before and after and adds ``sum r (w_after - w_before)``;
under XLA the update's values are made to depend on the sums read before it (``+ 0 * sum``),
so that the read runs before the in-place scatter instead of XLA copying the table. Querying
the epsilon recomputes ``s`` from the weights and compares within float64 rounding (``1e-10``
of ``sum |w|``): a move of the weights outside the DP step is refused. ``s`` is saved with the
model's DP state; ``load_weights`` and ``set_weights`` of a private model set it anew. Not
fingerprinted: engine-held tables, the tables of DP-SGD and DP-FEST, models on
``ParameterServerStrategy``. See docs/epsilon.md ("The DP state and the weight fingerprint").
"""

from __future__ import annotations

import tensorflow as tf

from sparse_dp.mechanisms.rows.padding import is_valid, mask_rows, padded_unique, safe_rows
from sparse_dp.mechanisms.rows.scans import compiling_with_xla

_MODULUS = 2**31 - 1  # products of two residues fit in int64
_ROW, _COLUMN, _VARIABLE, _MIX = 1_103_515_245, 12_345_679, 69_069, 1_664_525
_CHUNK_ROWS = 1 << 16
RELATIVE_TOLERANCE = 1e-10


class WeightsMovedOutsideDPError(RuntimeError):
  """The private weights changed outside the DP step: no epsilon covers them.

  Raised by :meth:`~sparse_dp.training.PrivateTraining.epsilon` and
  :meth:`~sparse_dp.training.PrivateTraining.report` when the weights' fingerprint no
  longer matches the DP step's (another model's ``fit``, a layer shared with a model
  trained without DP, a custom loop's optimizer, an assign). Restore saved weights with
  ``load_weights`` or ``set_weights``, which set the fingerprint anew.
  """


def _signs(index: int, rows: tf.Tensor, width: int) -> tf.Tensor:
  """``r(i, j)`` for rows ``rows`` (int64 ``[n]``) and every column: ``[n, width]`` float64.

  The definition, as the DP step computes it on the rows it updates:
  ``h = ((i R + j C + v V) mod M) K + 1) mod M``, ``r = 1 - 2 ((h // 7) mod 2)``,
  ``M = 2^31 - 1`` (no int64 overflow: ``i mod M < 2^31`` and ``R < 2^31``). A full
  read of a table computes the same integers by :func:`_signs_of_terms`.
  """
  rows = tf.math.floormod(tf.cast(rows, tf.int64), _MODULUS)
  columns = tf.range(width, dtype=tf.int64)
  h = tf.math.floormod(rows[:, None] * _ROW + columns[None, :] * _COLUMN + index * _VARIABLE,
                       _MODULUS)
  h = tf.math.floormod(h * _MIX + 1, _MODULUS)
  return 1.0 - 2.0 * tf.cast(tf.math.floormod(h // 7, 2), tf.float64)


def _row_terms(rows: tf.Tensor) -> tf.Tensor:
  """``i R mod M`` of each row ``i``."""
  return tf.math.floormod(tf.math.floormod(tf.cast(rows, tf.int64), _MODULUS) * _ROW, _MODULUS)


def _column_terms(index, width: int) -> tf.Tensor:
  """``(j C + v V) mod M`` of each column ``j`` of variable ``v``."""
  return tf.math.floormod(tf.range(width, dtype=tf.int64) * _COLUMN + tf.cast(index, tf.int64)
                          * _VARIABLE, _MODULUS)


def _signs_of_terms(row_terms: tf.Tensor, column_terms: tf.Tensor) -> tf.Tensor:
  """:func:`_signs` from its row and column terms, without an integer division per weight
  (a full read of a 100x Table-3 model signs 3e9 weights; the DP step, a few thousand rows):
  the terms' sum less ``M`` once if it reaches ``M``; the second reduction by ``M``'s
  Mersenne form (``x mod M`` is ``(x & M) + (x >> 31)``, less ``M`` once if it reaches ``M``,
  exact for ``0 <= x < 2^62``); ``h // 7`` as ``floor(h / 7)`` in float64, exact for
  ``h < 2^53``. The same integers as :func:`_signs`
  (``tests/unit/training/test_weight_fingerprint.py``).
  """
  h = _below_modulus(row_terms[:, None] + column_terms[None, :])
  h = h * _MIX + 1
  h = _below_modulus(tf.bitwise.bitwise_and(h, _MODULUS) + tf.bitwise.right_shift(h, 31))
  quotient = tf.cast(tf.math.floor(tf.cast(h, tf.float64) / 7.0), tf.int64)
  return 1.0 - 2.0 * tf.cast(tf.bitwise.bitwise_and(quotient, 1), tf.float64)


def _below_modulus(h: tf.Tensor) -> tf.Tensor:
  """``h mod M`` for ``0 <= h < 2 M``."""
  return tf.where(h >= _MODULUS, h - _MODULUS, h)


def _as_rows(values: tf.Tensor) -> tf.Tensor:
  """A weight as ``[rows, width]``: a vector or scalar is one row."""
  return tf.reshape(values, [-1, values.shape[-1]]) if values.shape.rank >= 2 else (
      tf.reshape(values, [1, -1]))


def _rows_of(variable, rows: tf.Tensor) -> tf.Tensor:
  """Rows ``rows`` (a padded row list) of a table; the padding reads as zeros."""
  return mask_rows(tf.gather(variable, safe_rows(rows)), is_valid(rows))


def _partial(index: int, rows: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
  """``sum r w`` over the given rows of variable ``index``."""
  values = tf.cast(values, tf.float64)
  return tf.reduce_sum(_signs(index, rows, values.shape[-1]) * values)


@tf.function(jit_compile=True)
def _compiled_partial(row_terms: tf.Tensor, column_terms: tf.Tensor, values: tf.Tensor):
  """``sum r w`` of one chunk of a large table in one pass fused by XLA (TensorFlow's
  kernels would write each ``[rows, width]`` intermediate); the terms come in computed,
  since XLA would recompute them, divisions included, for every weight."""
  return tf.reduce_sum(_signs_of_terms(row_terms, column_terms) * tf.cast(values, tf.float64))


class Fingerprint:
  """The fingerprint of ``variables`` (in a fixed order), kept in ``state_variable``."""

  def __init__(self, variables: list, state_variable: tf.Variable):
    self.variables = list(variables)
    self.value = state_variable

  def compute(self) -> tuple[float, float]:
    """``(s(w), sum |w|)`` of the weights now, in chunks of rows (eager; a table of a
    chunk or more through :func:`_compiled_partial`; ``sum |w|``, the tolerance's scale,
    summed in float32).

    A table is read ``_CHUNK_ROWS`` rows at a time (``tf.gather`` of the
    variable): reading it whole would copy it, since a variable that sparse
    updates have touched copies itself on every dense read
    (``copy_on_read_mode`` in TensorFlow's ``core/framework/resource_var.h``): a
    transient the size of the largest table at each epsilon query.
    """
    total, magnitude = 0.0, 0.0
    for index, variable in enumerate(self.variables):
      values = None if variable.shape.rank == 2 else _as_rows(tf.convert_to_tensor(variable))
      num_rows = int(variable.shape[0]) if values is None else int(values.shape[0])
      compiled = num_rows >= _CHUNK_ROWS  # XLA: one compile per width (and last chunk's rows)
      if compiled:
        columns = _column_terms(index, int((variable if values is None else values).shape[-1]))
      for start in range(0, num_rows, _CHUNK_ROWS):
        rows = tf.range(start, min(start + _CHUNK_ROWS, num_rows), dtype=tf.int64)
        chunk = tf.gather(variable if values is None else values, rows)
        if compiled:
          total += float(_compiled_partial(_row_terms(rows), columns, chunk))
        else:
          total += float(_partial(index, rows, chunk))
        magnitude += float(tf.reduce_sum(tf.abs(tf.cast(chunk, tf.float32))))
    return total, magnitude

  def reset(self) -> None:
    """Takes the weights as they are now as the DP step's (after a restore)."""
    self.value.assign(self.compute()[0])

  def moved(self) -> bool:
    """Whether the weights moved since the last DP step (or :meth:`reset`)."""
    now, magnitude = self.compute()
    return abs(now - float(self.value.numpy())) > RELATIVE_TOLERANCE * (magnitude + 1.0)

  def before_update(self, gradients: dict) -> tuple[list, dict]:
    """Reads the rows the update is about to change; returns ``(read, gradients)``.

    ``read`` holds ``(index, rows, sum r w_before, sparse)`` per variable the
    update changes; ``gradients`` are the ones to apply: the same values, under
    XLA made to depend on the sums read (see the module docstring).
    """
    read, ordered = [], dict(gradients)
    for index, variable in enumerate(self.variables):
      gradient = gradients.get(variable.ref())
      if gradient is None:
        continue
      if isinstance(gradient, tf.IndexedSlices):  # a table's selected rows (padded list)
        rows = padded_unique(tf.cast(gradient.indices, tf.int64)).values
        before = _partial(index, rows, _rows_of(variable, rows))
      else:
        values = _as_rows(tf.identity(variable))
        rows = tf.range(tf.shape(values, out_type=tf.int64)[0])
        before = _partial(index, rows, values)
      read.append((index, rows, before, isinstance(gradient, tf.IndexedSlices)))
      if compiling_with_xla():
        ordered[variable.ref()] = _after(gradient, before)
    return read, ordered

  def after_update(self, read: list) -> tf.Operation:
    """Adds ``sum r (w_after - w_before)`` of the rows read by :meth:`before_update`."""
    if not read:
      return tf.no_op()
    delta = []
    for index, rows, before, sparse in read:
      variable = self.variables[index]
      after = _rows_of(variable, rows) if sparse else _as_rows(tf.identity(variable))
      delta.append(_partial(index, rows, after) - before)
    return self.value.assign_add(tf.add_n(delta))


def _after(gradient, read_sum: tf.Tensor):
  """``gradient`` plus an exact zero computed from ``read_sum`` (a data dependence).

  XLA does not fold ``x * 0`` for floats (``inf * 0`` is NaN), so the update
  cannot start before the read; a non-finite sum counts as 0.
  """
  finite = tf.where(tf.math.is_finite(read_sum), read_sum, tf.zeros_like(read_sum))
  if isinstance(gradient, tf.IndexedSlices):
    zero = tf.cast(finite * 0.0, gradient.values.dtype)
    return tf.IndexedSlices(gradient.values + zero, gradient.indices, gradient.dense_shape)
  return gradient + tf.cast(finite * 0.0, gradient.dtype)
