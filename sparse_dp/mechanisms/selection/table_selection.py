"""DP-AdaFEST's row selection for every table of a model in one draw (Ghazi et al., NeurIPS 2023,
Algorithm 1, lines 6-8).

The tables are laid end to end as one table of ``c = sum_t c_t`` rows: row ``j`` of table
``t`` is row ``o_t + j``, ``o_t = c_0 + ... + c_{t-1}``. The mechanism is the same as one
:func:`~sparse_dp.mechanisms.selection.row_selection.select_rows` per table (every row of any
table gets its own noise, and the zero rows pass at ``p = Psi(tau / (sigma1 C1))``
independently); only the graph changes, one selection instead of one per table. The rows are
split back into one padded row list per table with the room a per-table selection has (its
activated pairs plus ``false_positive_capacity(c_t, p)``). A table whose rows are cut (all
tables' false positives past ``false_positive_capacity(c, p)``, or its own past its room: each
at most ``FALSE_POSITIVE_OVERFLOW`` = 1e-18) is flagged ``over_capacity`` and the DP step
refuses the step. A *dense* table takes no part in the selection: all its rows are selected,
as DP-SGD noises every row. See docs/reference/mechanisms.md ("Every table in one draw").
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import tensorflow as tf

from sparse_dp.mechanisms.rows import padding, scans
from sparse_dp.mechanisms.rows.activations import Activations, distinct_pairs
from sparse_dp.mechanisms.rows.stacking import StackedTables
from sparse_dp.mechanisms.selection.contribution_map import clipped_contribution_maps
from sparse_dp.mechanisms.selection.row_selection import (
  RowSelection,
  false_positive_capacity,
  false_positive_probability,
  merged_rows,
  threshold_rows,
)


class StackedSelection(NamedTuple):
  """The selected rows of every table in the stacked id space
  (:mod:`~sparse_dp.mechanisms.rows.stacking`), with each table's counts.

  Attributes:
    rows: int64 ``[n + K]``, the selected stacked rows (true and false positives), sorted,
      then ``PAD``: ``n`` activated pairs, ``K = false_positive_capacity(c, p)``.
    num_true_positives: int64 ``[T]``, per table, the contributed rows that passed ``tau``.
    num_dropped: int64 ``[T]``, per table, the contributed rows that did not pass ``tau``.
    num_false_positives: int64 ``[T]``, per table, the zero-contribution rows that passed.
    cut: bool ``[T]``, per table, whether the joint draw's overflow may have cut its rows.
    num_rows: int64 ``[T]``, per table, its rows in ``rows``: true and false positives, or
      every row of a dense table (which has no true or false positives).
  """

  rows: tf.Tensor
  num_true_positives: tf.Tensor
  num_dropped: tf.Tensor
  num_false_positives: tf.Tensor
  cut: tf.Tensor
  num_rows: tf.Tensor

  def over_capacity(self, rooms) -> tf.Tensor:
    """bool ``[T]``: per table, its rows cut by the joint draw or more than its room.

    Args:
      rooms: per table, the length of its row list (int64 scalars), or ``None`` where every
        row is kept (graph mode).

    Returns:
      bool ``[T]``: true where ``cut``, or, given rooms, where ``num_rows`` exceeds the room.
    """
    if rooms is None:
      return self.cut
    return tf.logical_or(self.cut,
                         self.num_rows > tf.stack([tf.cast(r, tf.int64) for r in rooms]))


def false_positive_rooms(vocabulary_sizes: Sequence[int], threshold: float,
                         noise_stddev: float) -> list[int]:
  """Per table, the room for its false positives, ``false_positive_capacity(c_t, p)``; a
  table's selected rows have room for its lookups plus these.

  Args:
    vocabulary_sizes: ``c_t``.
    threshold: ``tau``.
    noise_stddev: ``sigma1 * C1``.

  Returns:
    A list of ints, ``false_positive_capacity(c_t, p)`` per table, in order.
  """
  probability = false_positive_probability(threshold, noise_stddev)
  return [false_positive_capacity(int(size), probability) for size in vocabulary_sizes]


def select_stacked_rows(example: tf.Tensor, row: tf.Tensor, stacked: StackedTables,
                        batch_size: tf.Tensor, clip_norm: float, threshold: float,
                        noise_stddev: float, seed: tf.Tensor, distinct: bool = False,
                        dense: Sequence[bool] = ()) -> StackedSelection:
  """DP-AdaFEST's row selection (Algorithm 1, lines 6-8) of every table in one draw.

  The law is :func:`select_rows_of_tables`'s; the lookups come in the stacked id space.
  A dense table's lookups are left out of the contribution map and every one of its rows is
  selected; the other tables' rows are those the same seed selects of them alone.

  Args:
    example: int64 ``[n]``, the example of each lookup, in ``[0, batch_size)``.
    row: int64 ``[n]``, the stacked row of each lookup, or ``PAD``; they may repeat.
    stacked: the tables, laid end to end.
    batch_size, clip_norm, threshold, noise_stddev, seed: as for
      :func:`select_rows_of_tables` (``B``, ``C1``, ``tau``, ``sigma1 C1``, a ``[2]`` seed).
    distinct: the pairs are distinct already and sorted by ``(row, example)``, then ``PAD``
      (as :func:`~sparse_dp.mechanisms.per_example_row_gradients` returns them): no sort.
    dense: per table, whether it is dense (all its rows selected); ``()``: none is.

  Returns:
    The :class:`StackedSelection`.

  Raises:
    ValueError: ``threshold <= 0``; ``noise_stddev <= 0``; more than ``MAX_POSITIONS``
      rows expected to pass by noise alone; or ``dense`` not one flag per table, or every
      table dense.
  """
  batch_size = tf.cast(batch_size, tf.int64)
  example, row = tf.cast(example, tf.int64), tf.cast(row, tf.int64)
  if dense and len(dense) != stacked.num_tables:
    raise ValueError(f"dense must flag each of the {stacked.num_tables} tables, got "
                     f"{list(dense)}")
  if any(dense):
    return _with_dense_tables(example, row, stacked, tuple(bool(d) for d in dense), batch_size,
                              clip_norm, threshold, noise_stddev, seed)
  if not distinct:
    example, row, _ = distinct_pairs(example, row, batch_size)
  (contribution,) = clipped_contribution_maps([Activations(example, row, batch_size)], clip_norm)
  chosen = threshold_rows(contribution, stacked.num_rows, threshold, noise_stddev, seed)
  rows = merged_rows(contribution, chosen)
  table_of_row = stacked.table_of(contribution.rows)
  num_true = _count_by_table(chosen.passed, table_of_row, stacked.num_tables)
  num_contributed = _count_by_table(padding.is_valid(contribution.rows), table_of_row,
                                    stacked.num_tables)
  first, last = stacked.bounds(rows)
  # When the joint draw overflowed, it decided the rows up to its last false
  # positive only: a table with rows past it may miss some.
  last_drawn = tf.reduce_max(tf.concat([[-1], tf.where(
      padding.is_valid(chosen.false_positives), chosen.false_positives, -1)], 0))
  ends = tf.constant(stacked.offsets[1:], tf.int64)
  # A table's rows are its true positives and the false positives the list holds.
  return StackedSelection(rows, num_true, num_contributed - num_true, last - first - num_true,
                          tf.logical_and(chosen.over_capacity, ends - 1 > last_drawn),
                          last - first)


def _with_dense_tables(example, row, stacked: StackedTables, dense: tuple, batch_size,
                       *selection_args) -> StackedSelection:
  """:func:`select_stacked_rows` with dense tables: the others' selection as if they were the
  only tables (their rows renumbered end to end), and every row of the dense ones."""
  if all(dense):
    raise ValueError(f"dense must leave one table sparse (every table dense is DP-SGD), got "
                     f"{list(dense)}")
  kept = [t for t, is_dense in enumerate(dense) if not is_dense]
  sparse = StackedTables([stacked.sizes[t] for t in kept], [stacked.widths[t] for t in kept])
  # Stacked row o_t + j of a sparse table is row o'_t + j of the sparse tables alone.
  shift = np.zeros(stacked.num_tables + 1, np.int64)
  shift[kept] = stacked.offsets[kept] - sparse.offsets[:-1]
  table = stacked.table_of(row)
  in_sparse = tf.gather(tf.constant([not d for d in dense] + [False]), table)
  chosen = select_stacked_rows(example, tf.where(in_sparse, row - tf.gather(shift, table),
                                                 padding.PAD),
                               sparse, batch_size, *selection_args)
  back = tf.gather(tf.constant(shift[kept + [stacked.num_tables]]), sparse.table_of(chosen.rows))
  every_row = [tf.range(stacked.offsets[t], stacked.offsets[t + 1]) for t, d in enumerate(dense)
               if d]
  rows = tf.sort(tf.concat([tf.where(padding.is_valid(chosen.rows), chosen.rows + back,
                                     padding.PAD), *every_row], 0))
  index = tf.constant(kept, tf.int64)[:, None]

  def by_table(per_sparse_table, dense_value=0):
    filled = tf.fill([stacked.num_tables], tf.cast(dense_value, per_sparse_table.dtype))
    return tf.tensor_scatter_nd_update(filled, index, per_sparse_table)

  return StackedSelection(
      rows, by_table(chosen.num_true_positives), by_table(chosen.num_dropped),
      by_table(chosen.num_false_positives), by_table(chosen.cut, False),
      tf.where(tf.constant(dense), tf.constant(stacked.sizes, tf.int64),
               by_table(chosen.num_rows)))


def select_rows_of_tables(pairs: Sequence[tuple[tf.Tensor, tf.Tensor]],
                          vocabulary_sizes: Sequence[int], batch_size: tf.Tensor,
                          clip_norm: float, threshold: float, noise_stddev: float,
                          seed: tf.Tensor) -> list[RowSelection]:
  """Each table's :class:`RowSelection`, from the jointly clipped contribution map of a batch.

  This is DP-AdaFEST's row selection (Algorithm 1, lines 6-8) for every table in one draw.
  The tables are laid end to end as one table of ``c = sum_t c_t`` rows.
  Row ``j`` of table ``t`` is row ``o_t + j``, with ``o_t = c_0 + ... + c_{t-1}``.
  The mechanism is the same as one
  :func:`~sparse_dp.mechanisms.selection.row_selection.select_rows` per table: every row gets
  its own noise, and the zero rows pass independently at ``p = Psi(tau / (sigma1 C1))``.
  Only the graph changes: one selection instead of one per table.
  A table whose rows are cut is flagged ``over_capacity``, and the DP step refuses the step.
  Rows are cut when all tables' false positives exceed ``false_positive_capacity(c, p)``, or
  one table's exceed its room; each happens with probability at most 1e-18.

  Args:
    pairs: per table, the batch's lookups ``(example, row)`` (int64 vectors;
      rows in ``[0, c_t)``, checked in graph mode, or
      :data:`~sparse_dp.mechanisms.rows.padding.PAD`; they may repeat).
    vocabulary_sizes: rows ``c_t`` of each table.
    batch_size: examples of the batch (int64 scalar).
    clip_norm: ``C1``.
    threshold: ``tau`` (> 0).
    noise_stddev: ``sigma1 * C1``.
    seed: shape ``[2]`` integer seed of the stateless random ops.

  Returns:
    A list with one :class:`RowSelection` per table, in its own row numbering; its
      ``rows`` hold as many entries as the table's ``pairs`` plus
      ``false_positive_capacity(c_t, p)``.

  Raises:
    ValueError: ``pairs`` is empty or not one per table; ``threshold <= 0``;
      ``noise_stddev <= 0``; or more than ``MAX_POSITIONS`` rows expected to pass by noise
      alone.
    tf.errors.InvalidArgumentError: in graph mode, a row outside its table's ``[0, c_t)``.
  """
  if len(pairs) != len(vocabulary_sizes) or not pairs:
    raise ValueError(f"select_rows_of_tables needs the pairs of each of its "
                     f"{len(vocabulary_sizes)} tables, got {len(pairs)}")
  stacked = StackedTables(vocabulary_sizes, [1] * len(pairs))
  selection = select_stacked_rows(
      tf.concat([tf.cast(example, tf.int64) for example, _ in pairs], 0),
      stacked.stack_rows([_checked(row, size) for (_, row), size in zip(pairs, vocabulary_sizes)]),
      stacked, batch_size, clip_norm, threshold, noise_stddev, seed)
  rooms = [tf.size(row, out_type=tf.int64) + room for (_, row), room in zip(
      pairs, false_positive_rooms(vocabulary_sizes, threshold, noise_stddev))]
  parts = stacked.split(selection.rows, rooms=rooms)
  counts = zip(*(tf.unstack(n) for n in (selection.num_true_positives, selection.num_dropped,
                                         selection.num_false_positives,
                                         selection.over_capacity(rooms))))
  return [RowSelection(rows, *table_counts) for (rows, _), table_counts in zip(parts, counts)]


def _checked(row: tf.Tensor, size: int) -> tf.Tensor:
  """``row`` (int64); in graph mode, refuses a row outside ``[0, size)`` (it would land in
  another table). Under XLA asserts compile away: the DP step's rows are in range by
  construction (``Embedding`` maps ids outside to row 0)."""
  row = tf.cast(row, tf.int64)
  if scans.compiling_with_xla():
    return row
  in_table = tf.logical_or(tf.logical_not(padding.is_valid(row)),
                           tf.logical_and(row >= 0, row < int(size)))
  with tf.control_dependencies([tf.debugging.Assert(tf.reduce_all(in_table), [
      f"select_rows_of_tables: a row outside [0, {int(size)}), the rows of its table"])]):
    return tf.identity(row)


def _count_by_table(mask: tf.Tensor, table: tf.Tensor, num_tables: int) -> tf.Tensor:
  """Per table, how many entries are in ``mask`` (``table`` from ``StackedTables.table_of``)."""
  return tf.math.unsorted_segment_sum(tf.cast(mask, tf.int64), table, num_tables + 1)[:-1]
