"""Every table of a model in one id space, so that a DP step is one program for all tables.

Table ``t`` of ``c_t`` rows and width ``d_t`` owns rows ``[o_t, o_t + c_t)`` of a stacked
table of ``c = sum_t c_t`` rows, ``o_t = c_0 + ... + c_{t-1}``, and width ``D = max_t d_t``:
its row vectors are padded with zeros to ``D``. TPU embedding engines stack tables the same
way (TensorFlow's table stacking on SparseCore, FBGEMM's table-batched embeddings). A
gradient's norm, a clipped sum and a row's noise are the same computed on the stacked rows as
on each table's: the padding coordinates hold zeros and get no noise. The per-example row
lists, their sort, the contribution map, the selection and the noise are then built once,
whatever the number of tables; only the last split back into each table's update is per
table. See docs/reference/mechanisms.md ("Every table in one draw").
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from sparse_dp.mechanisms.rows import padding, scans


class StackedTables:
  """Tables laid end to end: row ``j`` of table ``t`` is stacked row ``o_t + j``.

  Args:
    vocabulary_sizes: ``c_t``, each table's rows.
    widths: ``d_t``, each table's row width.

  Raises:
    ValueError: no tables, or sizes and widths of different lengths or not positive.
  """

  def __init__(self, vocabulary_sizes: Sequence[int], widths: Sequence[int]):
    sizes, widths = [int(c) for c in vocabulary_sizes], [int(d) for d in widths]
    if not sizes or len(sizes) != len(widths) or min(sizes + widths) < 1:
      raise ValueError(f"StackedTables needs one positive size and width per table, got "
                       f"sizes {sizes} and widths {widths}")
    self.sizes, self.widths = sizes, widths
    self.offsets = np.cumsum([0] + sizes).astype(np.int64)  # o_t, then c
    self.width = max(widths)

  @property
  def num_tables(self) -> int:
    """``T``, the tables stacked."""
    return len(self.sizes)

  @property
  def num_rows(self) -> int:
    """``c``, the stacked table's rows."""
    return int(self.offsets[-1])

  def stack(self, rows: Sequence[tf.Tensor], values: Sequence[tf.Tensor]) -> tuple:
    """Each table's rows and row vectors as the stacked table's.

    Args:
      rows: per table, int64 ``[n_t]`` rows in ``[0, c_t)`` or ``PAD`` (kept ``PAD``).
      values: per table, ``[n_t, d_t]``.

    Returns:
      ``(rows [sum n_t], values [sum n_t, D])``, the tables' in order.
    """
    padded = [tf.pad(value, [[0, 0], [0, self.width - width]]) if width < self.width else value
              for value, width in zip(values, self.widths)]
    return self.stack_rows(rows), tf.concat(padded, 0)

  def stack_rows(self, rows: Sequence[tf.Tensor]) -> tf.Tensor:
    """Each table's rows as stacked rows, the tables' in order.

    Args:
      rows: per table, int64 ``[n_t]`` rows in ``[0, c_t)`` or ``PAD``.

    Returns:
      int64 ``[sum n_t]``, row ``j`` of table ``t`` as ``o_t + j``; ``PAD`` kept.
    """
    rows = [tf.cast(table_rows, tf.int64) for table_rows in rows]
    lengths = [table_rows.shape[0] for table_rows in rows]
    if None not in lengths:  # known lengths: one offset per entry, one shift for all tables
      stacked = tf.concat(rows, 0)
      offsets = tf.constant(np.repeat(self.offsets[:-1], lengths), tf.int64)
      return tf.where(padding.is_valid(stacked), stacked + offsets, stacked)
    shifted = []
    for offset, table_rows in zip(self.offsets, rows):
      shifted.append(tf.where(padding.is_valid(table_rows), table_rows + int(offset), table_rows)
                     if offset else table_rows)
    return tf.concat(shifted, 0)

  def table_of(self, rows: tf.Tensor) -> tf.Tensor:
    """The table of each stacked row.

    Args:
      rows: int64 ``[n]``, stacked rows or ``PAD``.

    Returns:
      int64 ``[n]``, each row's table ``t``; ``num_tables`` for ``PAD``.
    """
    table = _count_at_most(tf.constant(self.offsets[1:], tf.int64), padding.safe_rows(rows))
    return tf.where(padding.is_valid(rows), table, self.num_tables)

  def coordinate_mask(self, rows: tf.Tensor) -> tf.Tensor:
    """The coordinates of the stacked width ``D`` that belong to each row's table.

    Args:
      rows: int64 ``[n]``, stacked rows or ``PAD``.

    Returns:
      bool ``[n, D]``: true on the first ``d_t`` coordinates of a row of table ``t``; none
        for ``PAD``.
    """
    widths = tf.constant(self.widths + [0], tf.int64)
    row_width = tf.gather(widths, self.table_of(rows))
    return tf.range(self.width, dtype=tf.int64)[None, :] < row_width[:, None]

  def bounds(self, sorted_rows: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Where each table's rows lie in a sorted stacked row list.

    Args:
      sorted_rows: a padded row list of stacked rows (sorted, then ``PAD``).

    Returns:
      ``(first [T], last [T])``, int64: table ``t``'s rows are
        ``sorted_rows[first_t:last_t]``.
    """
    below = _count_below(sorted_rows, tf.constant(self.offsets, tf.int64))  # [T + 1]
    return below[:-1], below[1:]

  def split(self, sorted_rows: tf.Tensor, values: Optional[tf.Tensor] = None,
            rooms: Optional[Sequence] = None) -> list[tuple]:
    """Each table's part of a sorted stacked row list, in its own rows and width.

    Args:
      sorted_rows: int64 ``[m]``, a padded row list of stacked rows (sorted, then ``PAD``).
      values: ``[m, D]``, a vector per row, or ``None``.
      rooms: per table, the length of its part (int64 scalars, static under XLA): its rows,
        then ``PAD`` rows of zeros; a table with more rows is cut to its room (the caller
        flags it). ``None``: each part holds exactly the table's rows (dynamic shapes).

    Returns:
      Per table, ``(rows, values)``: int64 ``[room_t]`` in ``[0, c_t)`` then ``PAD``, and
        ``[room_t, d_t]`` (``None`` without ``values``).
    """
    first, last = self.bounds(sorted_rows)
    lengths = last - first if rooms is None else tf.cast(tf.stack(rooms), tf.int64)
    # Laid end to end, the parts are one gather of the list: position p of table t's part
    # reads entry first_t + (p - start_t) while it is below last_t, else one PAD past the end.
    starts = tf.cumsum(lengths, exclusive=True)  # T values: no long scan under XLA
    total = tf.reduce_sum(lengths)
    table = part_of_each_position(lengths)
    index = tf.gather(first, table) + tf.range(total) - tf.gather(starts, table)
    index = tf.where(index < tf.gather(last, table), index, tf.size(sorted_rows,
                                                                   out_type=tf.int64))
    stacked = tf.gather(tf.concat([sorted_rows, [padding.PAD]], 0), index)
    offsets = tf.gather(tf.constant(self.offsets[:-1], tf.int64), table)
    parts = tf.split(tf.where(padding.is_valid(stacked), stacked - offsets, stacked), lengths,
                     num=self.num_tables)
    if values is None:
      return [(part, None) for part in parts]
    values = tf.gather(tf.concat([values, tf.zeros_like(values[:1])], 0), index)
    return [(part, part_values if width == self.width else part_values[:, :width])
            for part, part_values, width in zip(
                parts, tf.split(values, lengths, num=self.num_tables), self.widths)]


def part_of_each_position(lengths) -> tf.Tensor:
  """The part each position of parts laid end to end belongs to.

  Lengths known when the graph is built give a constant. Otherwise, in graph mode, the count
  of parts ending at or before each position (TensorFlow's search, an empty part counted
  with the one before it); under XLA, where the lengths are constants once compiled, one fill
  per part (XLA:CPU searches and scans in quadratic time, :mod:`~sparse_dp.mechanisms.rows.
  scans`).

  Args:
    lengths (Sequence[int] | tf.Tensor): each part's length: Python ints, or int64 ``[T]``.

  Returns:
    int64 ``[sum lengths]``, each position's part in ``[0, T)``.
  """
  if not tf.is_tensor(lengths) and all(isinstance(n, int) for n in lengths):
    return tf.constant(np.repeat(np.arange(len(lengths)), lengths), tf.int64)
  if not scans.compiling_with_xla():
    return tf.searchsorted(tf.cumsum(lengths), tf.range(tf.reduce_sum(lengths)), side="right",
                           out_type=tf.int64)
  return tf.concat([tf.fill(length[None], tf.constant(t, tf.int64))
                    for t, length in enumerate(tf.unstack(lengths))], 0)


# Up to this many tables, a search among their offsets compares every pair (O(n T), a fused
# elementwise op) rather than sorting (XLA:CPU sorts about 3x slower than TensorFlow's kernel,
# and its search is a sort: mechanisms.rows.scans).
_COMPARED_TABLES = 64


def _count_at_most(sorted_bounds: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
  """For each of ``values``, how many of ``sorted_bounds`` are ``<= value`` (int64)."""
  if sorted_bounds.shape[0] > _COMPARED_TABLES:
    return scans.searchsorted(sorted_bounds, values, side="right")
  return tf.math.count_nonzero(sorted_bounds[None, :] <= values[:, None], axis=1,
                               dtype=tf.int64)


def _count_below(sorted_values: tf.Tensor, bounds: tf.Tensor) -> tf.Tensor:
  """For each of ``bounds``, how many of ``sorted_values`` are ``< bound`` (int64)."""
  if bounds.shape[0] > _COMPARED_TABLES + 1:
    return scans.searchsorted(sorted_values, bounds, side="left")
  return tf.math.count_nonzero(sorted_values[None, :] < bounds[:, None], axis=1, dtype=tf.int64)
