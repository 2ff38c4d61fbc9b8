"""Row-sparse Gaussian noise (Ghazi et al., NeurIPS 2023, Algorithm 1, line 9).

``G_t = sum_i [g_i]_C2 + C2 * N(0, sigma2^2 * diag(1[V_t[j] >= tau]) (x) 1_d)``:
the clipped gradient sum restricted to the selected rows, plus Gaussian noise
of standard deviation ``sigma2 * C2`` on every coordinate of those rows and no
others. The result stays a ``tf.IndexedSlices`` over the selected rows, so the
optimizer's update is a scatter on them. Row lists are padded
(:mod:`sparse_dp.mechanisms.rows.padding`): the padding gets neither signal nor
noise.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from sparse_dp.mechanisms.randomness.gaussian import standard_normal
from sparse_dp.mechanisms.rows import padding
from sparse_dp.mechanisms.rows.sorted_ids import sorted_lookup


def sum_on_rows(clipped_sum: tf.IndexedSlices, selected_rows: tf.Tensor,
                sorted_indices: bool = False) -> tf.Tensor:
  """The clipped sum restricted to the selected rows, as a dense tensor.

  Repeated indices are summed.
  Indices outside ``selected_rows`` are dropped.
  A selected row without a gradient, and the padding, get zeros.

  Args:
    clipped_sum: one table's sum of clipped per-example gradients.
    selected_rows: a padded row list ``[m]`` (sorted, distinct, then ``PAD``).
    sorted_indices: whether ``clipped_sum``'s indices are sorted (spares a sort under XLA).

  Returns:
    ``[m, d]``; row ``i`` is the sum of ``clipped_sum``'s slices at ``selected_rows[i]``.
  """
  selected_rows = tf.cast(selected_rows, tf.int64)
  slot, is_selected = sorted_lookup(selected_rows, tf.cast(clipped_sum.indices, tf.int64),
                                    sorted_indices)
  size = tf.size(selected_rows, out_type=tf.int64)
  # Dropped entries go to one extra segment past the end, cut off after the sum.
  return tf.math.unsorted_segment_sum(tf.convert_to_tensor(clipped_sum.values),
                                      tf.where(is_selected, slot, size), size + 1)[:-1]


def add_row_sparse_noise(clipped_sum: tf.IndexedSlices, selected_rows: tf.Tensor,
                         noise_stddev: float, seed: tf.Tensor) -> tf.IndexedSlices:
  """Masks ``clipped_sum`` to ``selected_rows`` and noises every selected row.

  It computes (Algorithm 1, line 9)
  ``G_t = sum_i [g_i]_C2 + C2 * N(0, sigma2^2 * diag(1[V_t[j] >= tau]) (x) 1_d)``.
  Every coordinate of a selected row gets noise of standard deviation ``sigma2 * C2``.
  Other rows get neither signal nor noise.

  Args:
    clipped_sum: sum of clipped per-example gradients of one table; its indices
      may repeat (they are summed) and may include unselected rows (dropped).
    selected_rows: the padded row list of
      :func:`sparse_dp.mechanisms.select_rows`.
    noise_stddev: ``sigma2 * C2``.
    seed: shape ``[2]`` integer seed.

  Returns:
    ``tf.IndexedSlices`` with one slice per entry of ``selected_rows``, in its
      order; the padding keeps its ``PAD`` index and has zero values (an embedding
      backend maps it to a row the update leaves alone).
  """
  kept = sum_on_rows(clipped_sum, selected_rows)
  return tf.IndexedSlices(kept + row_sparse_noise(selected_rows, kept, noise_stddev, seed),
                          tf.cast(selected_rows, tf.int64), clipped_sum.dense_shape)


def row_sparse_noise(selected_rows: tf.Tensor, kept: tf.Tensor, noise_stddev: float,
                     seed: tf.Tensor, coordinates: Optional[tf.Tensor] = None) -> tf.Tensor:
  """The noise that :func:`add_row_sparse_noise` adds to ``kept = sum_on_rows(...)``.

  Args:
    selected_rows: a padded row list ``[m]``.
    kept: ``[m, d]``, the restricted sum; only its shape and dtype are read.
    noise_stddev: ``sigma2 * C2``.
    seed: shape ``[2]`` integer seed.
    coordinates: bool ``[m, d]``, the coordinates each row has (stacked tables of several
      widths: :mod:`sparse_dp.mechanisms.rows.stacking`); ``None``: all ``d``.

  Returns:
    ``[m, d]`` of ``kept``'s dtype: ``N(0, noise_stddev^2)`` on the coordinates of the rows of
      ``selected_rows``, zero on its padding.
  """
  noise = standard_normal(tf.shape(kept), seed, kept.dtype) * noise_stddev
  if coordinates is not None:
    noise = tf.where(coordinates, noise, tf.zeros_like(noise))
  return padding.mask_rows(noise, padding.is_valid(selected_rows))
