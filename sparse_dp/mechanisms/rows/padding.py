"""Row lists of a fixed capacity, so that a DP step compiles with XLA.

XLA (``jit_compile=True``, and every program on a TPU) compiles a program only
when every shape is known when it is compiled. The sizes that depend on the
data (how many distinct rows a batch activates, how many rows pass the
threshold, how many false positives the geometric skips find) are therefore
never the sizes of tensors here: each row list is a buffer of a capacity
fixed by the shapes of the inputs (or, for false positives, by a tail bound,
:func:`sparse_dp.mechanisms.selection.row_selection.false_positive_capacity`), sorted,
with :data:`PAD` after its valid rows. ``PAD`` is the largest int64, so a
padded list is still sorted and ``searchsorted`` on it finds the valid rows;
every consumer masks the padding (``rows != PAD``) and gives it zero values.
The same code runs in graph mode, where the capacities may be dynamic: the
step is one program whether compiled or not.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from sparse_dp.mechanisms.rows import scans

PAD = int(np.iinfo(np.int64).max)
"""The padding of a row list: the largest int64, so a padded list stays sorted."""


class PaddedUnique(NamedTuple):
  """Distinct values of a vector, sorted, with their slots."""

  values: tf.Tensor  # int64 [n]: the distinct values, sorted, then PAD
  slot: tf.Tensor  # int64 [n]: input i is values[slot[i]]
  count: tf.Tensor  # int64: distinct values (PAD is not counted)


def is_valid(rows: tf.Tensor) -> tf.Tensor:
  """Where a padded row list holds a row, not :data:`PAD`.

  Args:
    rows: a padded row list (int64, any shape).

  Returns:
    bool of the shape of ``rows``, true where the entry is a row.
  """
  return tf.not_equal(rows, PAD)


def padded_unique(values: tf.Tensor, is_sorted: bool = False) -> PaddedUnique:
  """The distinct values of a vector, sorted, in a buffer of the vector's length.

  A sort-based unique: sort, mark the first of each run of equal values, and number the runs by
  a cumulative sum.
  Entries equal to :data:`PAD` are padding and stay so: they get the padding's slot and are not
  counted.
  Unlike ``tf.unique``, every output shape is the input's.

  Args:
    values: int64 ``[n]``, each ``>= 0`` or :data:`PAD`.
    is_sorted: whether ``values`` are sorted already (then no sort is made).

  Returns:
    ``PaddedUnique(values, slot, count)``.
      ``values`` (int64 ``[n]``) holds the distinct values, sorted, then ``PAD``.
      ``slot`` (int64 ``[n]``) places each input: input ``i`` is ``values[slot[i]]``.
      ``count`` (int64 scalar) is the number of distinct values, ``PAD`` not counted.
  """
  values = tf.cast(values, tf.int64)
  size = tf.size(values, out_type=tf.int64)
  order = None if is_sorted else tf.argsort(values, stable=True)
  ordered = values if is_sorted else tf.gather(values, order)
  previous = tf.concat([tf.constant([-1], tf.int64), ordered], axis=0)[:-1]
  first = tf.not_equal(ordered, previous)
  run = scans.cumsum(tf.cast(first, tf.int64)) - 1
  # An empty segment (past the last run) takes unsorted_segment_min's identity: PAD.
  distinct = tf.math.unsorted_segment_min(ordered, run, size)
  slot = run if is_sorted else tf.tensor_scatter_nd_update(tf.zeros_like(values),
                                                           order[:, None], run)
  count = tf.math.count_nonzero(tf.logical_and(first, is_valid(ordered)), dtype=tf.int64)
  return PaddedUnique(distinct, slot, count)


def sum_by_row(rows: tf.Tensor, values: tf.Tensor,
               is_sorted: bool = False) -> tuple[tf.Tensor, tf.Tensor]:
  """The values of each distinct row summed, in a buffer of the inputs' length.

  Args:
    rows: int64 ``[n]``, each ``>= 0`` or :data:`PAD`; they may repeat.
    values: ``[n, ...]``, one value per entry of ``rows``.
    is_sorted: whether ``rows`` are sorted already (:func:`padded_unique`).

  Returns:
    ``(rows, sums)``: the distinct rows, sorted, then ``PAD`` (:func:`padded_unique`), and
      each one's sum of ``values`` (zeros past the distinct rows; ``PAD`` entries' values sum
      into the first ``PAD`` slot).
  """
  unique = padded_unique(rows, is_sorted)
  return unique.values, tf.math.unsorted_segment_sum(values, unique.slot,
                                                     tf.size(rows, out_type=tf.int64))


def safe_rows(rows: tf.Tensor) -> tf.Tensor:
  """Rows to gather or scatter at, the padding replaced by row 0.

  Give the padding's entries zero values.

  Args:
    rows: a padded row list.

  Returns:
    ``rows`` with every :data:`PAD` replaced by 0.
  """
  return tf.where(is_valid(rows), rows, tf.zeros_like(rows))


def ordinary_slices(update):
  """A table update on a padded row list as ordinary ``tf.IndexedSlices``; others as they are.

  The padding (index ``PAD``, zero values) becomes zero slices at row 0: every
  index is then in the table, and the dense value is the same.
  """
  if not isinstance(update, tf.IndexedSlices):
    return update
  return tf.IndexedSlices(update.values, safe_rows(update.indices), update.dense_shape)


def mask_rows(values: tf.Tensor, keep: tf.Tensor) -> tf.Tensor:
  """``values [n, ...]`` with the rows where ``keep [n]`` is false set to zero."""
  keep = tf.reshape(keep, tf.concat([tf.shape(keep), tf.ones([values.shape.rank - 1], tf.int32)],
                                    axis=0))
  return tf.where(keep, values, tf.zeros_like(values))
