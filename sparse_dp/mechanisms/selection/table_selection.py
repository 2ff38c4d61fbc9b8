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
refuses the step. See docs/reference/mechanisms.md ("Every table in one draw").
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import tensorflow as tf

from sparse_dp.mechanisms.rows import padding, scans
from sparse_dp.mechanisms.rows.activations import Activations, distinct_pairs
from sparse_dp.mechanisms.selection.contribution_map import clipped_contribution_maps
from sparse_dp.mechanisms.selection.row_selection import (
  RowSelection,
  false_positive_capacity,
  false_positive_probability,
  merged_rows,
  threshold_rows,
)


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
  offsets = np.cumsum([0] + [int(size) for size in vocabulary_sizes])
  batch_size = tf.cast(batch_size, tf.int64)
  example, row, _ = distinct_pairs(
      tf.concat([tf.cast(example, tf.int64) for example, _ in pairs], 0),
      tf.concat([_shifted(row, offset, size)
                 for (_, row), offset, size in zip(pairs, offsets, vocabulary_sizes)], 0),
      batch_size)
  (contribution,) = clipped_contribution_maps([Activations(example, row, batch_size)], clip_norm)
  chosen = threshold_rows(contribution, int(offsets[-1]), threshold, noise_stddev, seed)
  # One PAD past the end: every table's gather below reads inside the list.
  rows = tf.concat([merged_rows(contribution, chosen), [padding.PAD]], 0)

  starts = tf.constant(offsets[:-1], tf.int64)
  ends = tf.constant(offsets[1:], tf.int64)
  table_of_row = _table_of(contribution.rows, ends)
  num_true = _count_by_table(chosen.passed, table_of_row, len(pairs))
  num_contributed = _count_by_table(padding.is_valid(contribution.rows), table_of_row, len(pairs))
  first = scans.searchsorted(rows, starts, side="left")
  last = scans.searchsorted(rows, ends, side="left")
  # A table's rows are its true positives and the false positives the list holds.
  num_false = last - first - num_true
  # When the joint draw overflowed, it decided the rows up to its last false
  # positive only: a table with rows past it may miss some.
  last_drawn = tf.reduce_max(tf.concat([[-1], tf.where(
      padding.is_valid(chosen.false_positives), chosen.false_positives, -1)], 0))
  cut = tf.logical_and(chosen.over_capacity, ends - 1 > last_drawn)
  probability = false_positive_probability(threshold, noise_stddev)
  selections = []
  for (_, table_pairs), size, offset, *counts in zip(
      pairs, vocabulary_sizes, offsets, *(tf.unstack(n) for n in (
          first, last, last - first, num_true, num_contributed - num_true, num_false, cut))):
    table_first, table_last, num_rows, table_true, table_dropped, table_false, table_cut = counts
    room = (tf.size(table_pairs, out_type=tf.int64)
            + false_positive_capacity(int(size), probability))
    index = table_first + tf.range(room)
    table_rows = tf.where(index < table_last,
                          tf.gather(rows, tf.minimum(index, table_last)) - int(offset), padding.PAD)
    selections.append(RowSelection(table_rows, table_true, table_dropped, table_false,
                                   tf.logical_or(table_cut, num_rows > room)))
  return selections


def _shifted(row: tf.Tensor, offset, size: int) -> tf.Tensor:
  """``row + offset``, the padding kept :data:`PAD`; in graph mode, refuses a row outside
  ``[0, size)`` (it would land in another table). Under XLA asserts compile away: the
  DP step's rows are in range by construction (``Embedding`` maps ids outside to row 0)."""
  row = tf.cast(row, tf.int64)
  if not scans.compiling_with_xla():
    in_table = tf.logical_or(tf.logical_not(padding.is_valid(row)),
                             tf.logical_and(row >= 0, row < int(size)))
    with tf.control_dependencies([tf.debugging.Assert(tf.reduce_all(in_table), [
        f"select_rows_of_tables: a row outside [0, {int(size)}), the rows of its table"])]):
      row = tf.identity(row)
  return tf.where(padding.is_valid(row), row + int(offset), row) if offset else row


def _table_of(rows: tf.Tensor, ends: tf.Tensor) -> tf.Tensor:
  """The table of each of ``rows`` (tables ending at ``ends``); ``len(ends)`` for the padding."""
  table = scans.searchsorted(ends, padding.safe_rows(rows), side="right")
  return tf.where(padding.is_valid(rows), table, tf.size(ends, out_type=tf.int64))


def _count_by_table(mask: tf.Tensor, table: tf.Tensor, num_tables: int) -> tf.Tensor:
  """Per table, how many entries are in ``mask`` (``table`` from :func:`_table_of`)."""
  return tf.math.unsorted_segment_sum(tf.cast(mask, tf.int64), table, num_tables + 1)[:-1]
