"""A fingerprint of the private weights that only the DP step's updates keep current.

``s(w) = sum_v sum_{i,j} a_v(i) b_v(j) w_v[i, j] = sum_v a_v^T W_v b_v`` (float64): each
variable ``v`` as rows ``W_v`` (a vector or scalar is one row), with coefficients
``+-(1 + h / 2^31)`` from an integer hash ``h`` of (variable, row) and of (variable, column).
The coefficients are distinct reals, so a move of the weights (an update, rows or columns
swapped, a table replaced) changes ``s`` unless it lies in one hyperplane; ``s`` of a table is a
matrix-vector product, read ``_CHUNK_ROWS`` rows at a time. The DP step keeps ``s`` current at
the cost of its update: it reads the rows it updates (every row of a variable updated densely,
such as a DP-SGD table) before and after and adds the difference; under XLA the update's values
are made to depend on the sums read before it (``+ 0 * sum``), so that the read runs before the
in-place update. Not fingerprinted: engine-held tables and models on
``ParameterServerStrategy``. See docs/epsilon.md ("The DP state and the weight fingerprint").
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from sparse_dp.mechanisms.rows.padding import PAD, is_valid, safe_rows
from sparse_dp.mechanisms.rows.scans import compiling_with_xla
from sparse_dp.mechanisms.rows.stacking import part_of_each_position

_MODULUS = 2**31 - 1  # products of two residues fit in int64
_ROW, _COLUMN, _VARIABLE, _MIX = 1_103_515_245, 12_345_679, 69_069, 1_664_525
_CHUNK_ROWS = 1 << 16
_STACKED_ROWS = 1 << 12  # a variable updated whole is read in a stack up to this many rows
RELATIVE_TOLERANCE = 1e-10


class WeightsMovedOutsideDPError(RuntimeError):
  """The private weights changed outside the DP step: no epsilon covers them.

  Raised where an epsilon is read or released (``epsilon()``, ``report()``, a save,
  ``make_private`` on a trained model) when the weights' fingerprint no longer matches
  the DP step's (another model's ``fit``, a layer shared with a model trained without DP,
  a custom loop's optimizer, an assign, weights loaded from a model without a matching
  DP record).
  """


def _coefficients(index, positions: tf.Tensor, stride: int) -> tf.Tensor:
  """``+-(1 + h / 2^31)`` (float64) of each position (row or column) of variable ``index``.

  ``h = ((((p mod M) S + v V) mod M) K + 1) mod M``, ``M = 2^31 - 1``, sign ``-`` where bit 7
  of ``h`` is set; every product stays below ``2^62`` and ``h / 2^31`` is exact.
  """
  h = tf.math.floormod(tf.math.floormod(tf.cast(positions, tf.int64), _MODULUS) * stride
                       + tf.cast(index, tf.int64) * _VARIABLE, _MODULUS)
  h = tf.math.floormod(h * _MIX + 1, _MODULUS)
  sign = 1.0 - 2.0 * tf.cast(tf.bitwise.bitwise_and(tf.bitwise.right_shift(h, 7), 1), tf.float64)
  return sign * (1.0 + tf.cast(h, tf.float64) * 2.0**-31)


def _static_coefficients(index, positions: np.ndarray, stride: int) -> np.ndarray:
  """:func:`_coefficients` computed when the graph is built (the same integers in NumPy).

  ``index`` is one variable's place or one per position.
  """
  h = ((positions.astype(np.int64) % _MODULUS) * stride
       + np.asarray(index, np.int64) * _VARIABLE) % _MODULUS
  h = (h * _MIX + 1) % _MODULUS
  return (1.0 - 2.0 * ((h >> 7) & 1)) * (1.0 + h * 2.0**-31)


def _column_coefficients(index: int, width: int) -> np.ndarray:
  """:func:`_coefficients` of columns ``0 .. width - 1`` of variable ``index``, as NumPy."""
  return _static_coefficients(index, np.arange(width), _COLUMN)


def _rows_sum(index, rows: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
  """``sum_i a(i) (w_i . b)`` over rows ``rows`` (int64 ``[n]``) of values ``[n, width]``."""
  values = tf.cast(values, tf.float64)
  static_index = tf.get_static_value(index)
  columns = (_coefficients(index, tf.range(values.shape[-1], dtype=tf.int64), _COLUMN)
             if static_index is None else _column_coefficients(int(static_index),
                                                               values.shape[-1]))
  return tf.reduce_sum(_coefficients(index, rows, _ROW) * tf.linalg.matvec(values, columns))


def _as_rows(values: tf.Tensor) -> tf.Tensor:
  """A weight as ``[rows, width]``: a vector or scalar is one row."""
  return tf.reshape(values, [-1, values.shape[-1]]) if values.shape.rank >= 2 else (
      tf.reshape(values, [1, -1]))


def _rows_of(variable, rows: tf.Tensor) -> tf.Tensor:
  """Rows ``rows`` (a padded row list) of a table; the padding reads as zeros."""
  return tf.where(is_valid(rows)[:, None], tf.gather(variable, safe_rows(rows)), 0.0)


def variable_sum(index, variable) -> tf.Tensor:
  """``s`` of one whole variable in the DP step, a table ``_CHUNK_ROWS`` rows at a time
  (static shapes, a ``tf.while_loop``).

  A table is read by ``tf.gather`` of a chunk, never whole: a variable that sparse updates
  have touched copies itself on every dense read (``copy_on_read_mode`` in TensorFlow's
  ``core/framework/resource_var.h``), a transient the size of the table.

  Args:
    index: the variable's place in the fingerprint's order.
    variable: the variable (or a tensor).

  Returns:
    ``s`` of the variable, float64.
  """
  if variable.shape.rank != 2 or variable.shape[0] <= _CHUNK_ROWS:
    values = _as_rows(tf.convert_to_tensor(variable))
    return _rows_sum(index, tf.range(tf.shape(values, out_type=tf.int64)[0]), values)
  num_rows = int(variable.shape[0])
  chunks = -(-num_rows // _CHUNK_ROWS)

  def body(chunk, total):
    rows = chunk * _CHUNK_ROWS + tf.range(_CHUNK_ROWS, dtype=tf.int64)
    padded = tf.where(rows < num_rows, rows, PAD)
    return chunk + 1, total + _rows_sum(index, rows, _rows_of(variable, padded))

  return tf.while_loop(lambda chunk, _: chunk < chunks, body,
                       (tf.constant(0, tf.int64), tf.constant(0.0, tf.float64)),
                       maximum_iterations=chunks)[1]


@tf.function(jit_compile=True)
def _compiled_parts(index, rows, values):
  """``(s, sum |w|)`` of one chunk of a table, fused by XLA (TensorFlow's kernels would
  write the float64 copy of the chunk)."""
  return _rows_sum(index, rows, values), tf.reduce_sum(tf.abs(tf.cast(values, tf.float64)))


def read_sum(index: int, variable) -> tuple[float, float]:
  """``(s, sum |w|)`` of one variable now (eager; a table a chunk at a time, by XLA).

  Args:
    index: the variable's place in the fingerprint's order.
    variable: the variable (or an array of its values).

  Returns:
    Its ``s`` and the scale of the tolerance, as floats.
  """
  shape = tf.TensorShape(variable.shape)
  if shape.rank != 2 or shape[0] < _CHUNK_ROWS:
    values = _as_rows(tf.convert_to_tensor(variable))
    rows = tf.range(tf.shape(values, out_type=tf.int64)[0])
    return (float(_rows_sum(index, rows, values)),
            float(tf.reduce_sum(tf.abs(tf.cast(values, tf.float64)))))
  total, magnitude, num_rows = 0.0, 0.0, int(variable.shape[0])
  for start in range(0, num_rows, _CHUNK_ROWS):
    rows = tf.range(start, min(start + _CHUNK_ROWS, num_rows), dtype=tf.int64)
    part, size = _compiled_parts(tf.constant(index, tf.int64), rows, tf.gather(variable, rows))
    total, magnitude = total + float(part), magnitude + float(size)
  return total, magnitude


class Fingerprint:
  """The fingerprint of ``variables`` (in a fixed order), kept in ``state_variable``."""

  def __init__(self, variables: list, state_variable: tf.Variable):
    self.variables = list(variables)
    self.value = state_variable

  def compute_each(self) -> tuple[list[float], float]:
    """``([s of each variable], sum |w|)`` of the weights now (eager, a table a chunk at a
    time)."""
    parts, magnitude = [], 0.0
    for index, variable in enumerate(self.variables):
      part, size = read_sum(index, variable)
      parts.append(part)
      magnitude += size
    return parts, magnitude

  def compute(self) -> tuple[float, float]:
    """``(s(w), sum |w|)`` of the weights now."""
    parts, magnitude = self.compute_each()
    return sum(parts), magnitude

  @staticmethod
  def close(now: float, value: float, magnitude: float) -> bool:
    """Whether fingerprints ``now`` and ``value`` agree within float64 rounding.

    Args:
      now: ``s(w)`` of the weights.
      value: a fingerprint they should have (the DP step's, or one a record carries).
      magnitude: ``sum |w|`` of the weights, the tolerance's scale.

    Returns:
      ``|now - value| <= 1e-10 (sum |w| + 1)``.
    """
    return abs(now - value) <= RELATIVE_TOLERANCE * (magnitude + 1.0)

  def moved(self) -> bool:
    """Whether the weights moved since the DP step last left them."""
    now, magnitude = self.compute()
    return not self.close(now, float(self.value.numpy()), magnitude)

  def before_update(self, gradients: dict) -> tuple["_Read", dict]:
    """Reads the rows the update is about to change; returns ``(read, gradients)``.

    A row-sparse gradient's indices are a sorted row list (the DP step's: its selected rows,
    then ``PAD``, or all row 0 in a refused step), read once each. Indices that were not sorted
    would be read as often as they repeat, and the fingerprint would then differ from the
    weights': a refusal, never a pass. Every table's updated rows are read as one stack
    (:class:`_TableRows`), and the variables of at most ``_STACKED_ROWS`` rows updated whole
    (a ``Dense`` layer's) as another (:class:`_WholeVariables`): per variable only its read
    and its product with its column coefficients, the rest once for all.

    ``read`` is handed to :meth:`after_update`; ``gradients`` are the ones to apply: the
    same values, under XLA made to depend on the sums read (see the module docstring).
    """
    read, ordered, tables, small = _Read([], []), dict(gradients), [], []
    for index, variable in enumerate(self.variables):
      gradient = gradients.get(variable.ref())
      if gradient is None:
        continue
      if _row_sparse(gradient, variable):  # a table's selected rows (padded list)
        tables.append((index, variable, gradient.indices))
      elif _num_rows(variable) <= _STACKED_ROWS:  # a Dense layer's weight, read whole
        small.append((index, variable))
      else:  # a table updated on every row (DP-SGD), a chunk at a time
        before = variable_sum(index, variable)
        read.whole.append((index, before))
        if compiling_with_xla():
          ordered[variable.ref()] = _after(gradient, before)
    stacks = ([_TableRows(tables)] if tables else []) + (
        [_WholeVariables(small)] if small else [])
    for stack in stacks:
      before = stack.sums()
      read.stacks.append((stack, before))
      if compiling_with_xla():
        total = tf.reduce_sum(before)
        for variable in stack.variables:
          ordered[variable.ref()] = _after(gradients[variable.ref()], total)
    return read, ordered

  def after_update(self, read: "_Read") -> tuple[tf.Operation, dict]:
    """Adds ``s(after) - s(before)`` of the rows read by :meth:`before_update`.

    Returns:
      ``(op, deltas)``: the op that updates ``s``, and each updated variable's change of
        ``s`` by its index.
    """
    deltas = {index: variable_sum(index, self.variables[index]) - before
              for index, before in read.whole}
    for stack, before in read.stacks:
      deltas.update(zip(stack.indices, tf.unstack(stack.sums() - before)))
    if not deltas:
      return tf.no_op(), deltas
    return self.value.assign_add(tf.add_n(list(deltas.values()))), deltas


class _TableRows:
  """The rows an update changes in every table, read as one stack.

  Entry ``k`` is ``(index, table, rows)``: ``rows`` a sorted padded row list (a refused step's
  is all row 0). The lists are laid end to end once: each repeat of a row within its table
  and every ``PAD`` read as zeros, the row coefficients ``a(i)`` computed once; per table
  only its gather and its product with its ``b`` (:func:`_entry_sums`).
  """

  def __init__(self, entries: list):
    self.indices = [index for index, _, _ in entries]
    self.variables = [table for _, table, _ in entries]
    rows = [tf.cast(table_rows, tf.int64) for _, _, table_rows in entries]
    lengths = [table_rows.shape[0] for table_rows in rows]
    if None in lengths:  # graph mode: the selection's length
      lengths = tf.stack([tf.size(table_rows, out_type=tf.int64) for table_rows in rows])
    self.owner = part_of_each_position(lengths)
    stacked = tf.concat(rows, 0)
    repeat = tf.concat([[False], tf.logical_and(tf.equal(stacked[1:], stacked[:-1]),
                                                tf.equal(self.owner[1:], self.owner[:-1]))], 0)
    self.read = tf.logical_and(is_valid(stacked), tf.logical_not(repeat))
    self.parts = tf.split(tf.where(self.read, stacked, tf.zeros_like(stacked)), lengths,
                          num=len(rows))
    self.coefficients = _coefficients(tf.gather(tf.constant(self.indices, tf.int64), self.owner),
                                      stacked, _ROW)

  def sums(self) -> tf.Tensor:
    """float64 ``[K]``: ``s`` of each table's rows now."""
    per_row = _entry_sums(self.indices, [tf.gather(table, rows) for table, rows in
                                         zip(self.variables, self.parts)])
    per_row = tf.where(self.read, self.coefficients * per_row, 0.0)
    return tf.math.unsorted_segment_sum(per_row, self.owner, len(self.indices))


class _WholeVariables:
  """Small variables updated whole (a ``Dense`` layer's weights), read as one stack: every
  row coefficient known when the graph is built, per variable only its read and its product
  with its ``b`` (:func:`_entry_sums`)."""

  def __init__(self, entries: list):
    self.indices = [index for index, _ in entries]
    self.variables = [variable for _, variable in entries]
    lengths = [_num_rows(variable) for variable in self.variables]
    self.owner = part_of_each_position(lengths)
    self.coefficients = tf.constant(_static_coefficients(
        np.repeat(self.indices, lengths), np.concatenate([np.arange(n) for n in lengths]), _ROW))

  def sums(self) -> tf.Tensor:
    """float64 ``[K]``: ``s`` of each variable now."""
    per_row = _entry_sums(self.indices, [_as_rows(tf.convert_to_tensor(variable))
                                         for variable in self.variables])
    return tf.math.unsorted_segment_sum(self.coefficients * per_row, self.owner,
                                        len(self.indices))


def _entry_sums(indices: list, values: list) -> tf.Tensor:
  """float64 ``[sum n_k]``: ``w_i . b`` of each row of each entry's ``[n_k, d_k]`` values, in
  order (one product per entry with its own ``b``: no padding to a common width)."""
  return tf.concat([
      tf.matmul(tf.cast(rows, tf.float64), _column_coefficients(index, rows.shape[-1])[:, None])
      for index, rows in zip(indices, values)], 0)[:, 0]


def _num_rows(variable) -> int:
  """The rows of a variable as rows (:func:`_as_rows`)."""
  shape = variable.shape
  return int(np.prod(shape[:-1])) if shape.rank >= 2 else 1


class _Read(NamedTuple):
  """What :meth:`Fingerprint.before_update` read: each large variable read whole and its
  ``s``, and the stacks of the other variables' rows with their ``s`` before the update."""

  whole: list  # (index, s before) per variable read whole, a chunk at a time
  stacks: list  # (_TableRows or _WholeVariables, float64 [K] s before)


def _row_sparse(gradient, variable) -> bool:
  """Whether ``gradient`` updates some rows of ``variable`` only (not a gradient over every
  row, as a DP-SGD table's IndexedSlices)."""
  if not isinstance(gradient, tf.IndexedSlices):
    return False
  rows = gradient.indices.shape[0]
  return rows is None or rows < variable.shape[0]


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
