"""Per-example clipping of embedding-row gradients without a per-example table.

For a lookup ``z = W[j]`` the per-example gradient of ``W`` is zero except on
row ``j``, where it is ``dL_i/dz`` (Ghazi et al., NeurIPS 2023, §2.1). So example ``i``'s
gradient on a table is a handful of rows, held as :class:`RowGradients`
triples ``(example, row, values)``; no ``[B, vocabulary, d]`` tensor exists.

DP-AdaFEST first zeroes the rows that did not pass the threshold (Algorithm 1,
line 8), then clips each example's gradient jointly over all parameters to
``C2``: ``[g_i]_C2 = g_i * min(1, C2 / ||g_i||)`` with
``||g_i||^2 = sum over tables of its row norms^2 + its dense-layer norm^2``
(line 9; Abadi et al., CCS 2016). Adding or removing an example then moves
the clipped sum by at most ``C2`` in L2 norm.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from sparse_dp.mechanisms.rows import padding
from sparse_dp.mechanisms.rows.activations import distinct_pairs
from sparse_dp.mechanisms.rows.sorted_ids import sorted_lookup


class RowGradients(NamedTuple):
  """Per-example gradients on the rows of one table, as padded triples.

  Example ``example[i]``'s gradient on row ``row[i]`` is ``values[i]``.
  The triples are padded (:mod:`sparse_dp.mechanisms.rows.padding`).
  Where ``row`` is ``PAD``, the values are zero and the example is 0.

  Attributes:
    example: int64 ``[n]``, the example of each triple.
    row: int64 ``[n]``, the table row of each triple, or ``PAD``.
    values: float ``[n, d]``, example ``example[i]``'s gradient on row ``row[i]``.
  """

  example: tf.Tensor  # int64 [n]
  row: tf.Tensor  # int64 [n]
  values: tf.Tensor  # float [n, d]


def per_example_row_gradients(example: tf.Tensor, row: tf.Tensor,
                              output_gradients: tf.Tensor,
                              batch_size: tf.Tensor) -> RowGradients:
  """Sums lookups of the same row by the same example into one row gradient.

  An id repeated within an example contributes the sum of its lookups.
  Lookups whose row is ``PAD`` (a padding example's) are padding.
  Their gradients are dropped, whatever they hold.

  Args:
    example: int ``[n]``, the example of each lookup.
    row: int ``[n]``, the row each lookup read, or ``PAD``.
    output_gradients: ``[n, d]``; ``output_gradients[i]`` is ``dL/dz`` for the lookup of
      ``row[i]`` by ``example[i]``, already scaled by the combiner (e.g. ``1/n`` for a mean).
    batch_size: int64 scalar, the examples of the batch.

  Returns:
    The distinct ``(example, row)`` pairs as triples, each with its summed gradient.
      There are as many triples as lookups: the pairs sorted by ``(row, example)``, then padding.
  """
  row = tf.cast(row, tf.int64)
  output_gradients = padding.mask_rows(output_gradients, padding.is_valid(row))
  example, row, index = distinct_pairs(tf.cast(example, tf.int64), row, batch_size)
  values = tf.math.unsorted_segment_sum(output_gradients, index, tf.size(row))
  return RowGradients(example, row, values)


def restrict_to_rows(gradients: RowGradients, rows: tf.Tensor,
                     sorted_rows: bool = False) -> RowGradients:
  """Keeps only the gradients of the selected rows (Algorithm 1, line 8).

  Args:
    gradients: one table's per-example row gradients.
    rows: the selected rows, a padded row list (sorted, distinct, then ``PAD``).
    sorted_rows: whether ``gradients.row`` is sorted (as :func:`per_example_row_gradients`
      returns it), which spares a sort under XLA.

  Returns:
    ``gradients`` with the triples of other rows made padding (row ``PAD``, zero values).
      The shapes stay.
  """
  _, found = sorted_lookup(tf.cast(rows, tf.int64), gradients.row, sorted_rows)
  keep = tf.logical_and(found, padding.is_valid(gradients.row))
  return RowGradients(gradients.example, tf.where(keep, gradients.row, padding.PAD),
                      padding.mask_rows(gradients.values, keep))


def zero_examples(gradients: RowGradients, kept: tf.Tensor) -> RowGradients:
  """Sets to zero the gradients of the examples that are not kept.

  Args:
    gradients: one table's per-example row gradients.
    kept: bool ``[batch_size]``, whether each example's gradients stay.

  Returns:
    The same triples, with the values of examples ``i`` where ``kept[i]`` is false set to zero.
  """
  keep = tf.gather(kept, gradients.example)[:, None]
  return gradients._replace(values=tf.where(keep, gradients.values,
                                            tf.zeros_like(gradients.values)))


def squared_norms(gradients: RowGradients, batch_size: tf.Tensor) -> tf.Tensor:
  """Each example's squared gradient norm ``||g_i||^2`` on one table.

  Args:
    gradients: one table's per-example row gradients.
    batch_size: int64 scalar, the examples of the batch.

  Returns:
    ``[batch_size]``, the sum of the squares of each example's row gradients.
  """
  per_row = tf.reduce_sum(tf.square(gradients.values), axis=-1)
  return tf.math.unsorted_segment_sum(per_row, gradients.example, batch_size)


def clip_factors(squared_norms_total: tf.Tensor, clip_norm: float) -> tf.Tensor:
  """The clipping factors ``min(1, C / ||g_i||)`` (Algorithm 1, line 9).

  Args:
    squared_norms_total: ``[B]``, each example's total squared gradient norm ``||g_i||^2``,
      summed over the tables and the dense layers.
    clip_norm: ``C``, the joint clipping norm ``C2``.

  Returns:
    ``[B]`` factors of the dtype of ``squared_norms_total``; 1 where ``||g_i|| <= C``.
  """
  norms = tf.sqrt(squared_norms_total)
  clip_norm = tf.cast(clip_norm, norms.dtype)
  return tf.where(norms > clip_norm, clip_norm / tf.maximum(norms, 1e-30),
                  tf.ones_like(norms))


def clipped_rows(gradients: RowGradients, factors: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
  """The clipped sum ``sum_i factors[i] * g_i``, one vector per distinct row.

  Args:
    gradients: per-example row gradients.
    factors: ``[B]``, each example's clipping factor (:func:`clip_factors`).

  Returns:
    ``(rows, values)`` as long as ``gradients``: a padded row list (the distinct rows, sorted,
      then ``PAD``) and each row's summed vector (zeros on the padding).
  """
  return padding.sum_by_row(gradients.row,
                            gradients.values * tf.gather(factors, gradients.example)[:, None])


def clipped_row_sum(gradients: RowGradients, factors: tf.Tensor,
                    dense_shape: tf.Tensor) -> tf.IndexedSlices:
  """The clipped sum ``sum_i factors[i] * g_i`` on one table, one slice per distinct row.

  Args:
    gradients: one table's per-example row gradients.
    factors: ``[B]``, each example's clipping factor (:func:`clip_factors`).
    dense_shape: the table's shape ``[V, d]``.

  Returns:
    ``tf.IndexedSlices`` with as many slices as ``gradients`` has entries.
      The slices are the distinct rows, sorted, then zero slices at row 0.
      Those are the padding, harmless in any sum.
  """
  rows, values = clipped_rows(gradients, factors)
  return tf.IndexedSlices(values, padding.safe_rows(rows), tf.cast(dense_shape, tf.int64))
