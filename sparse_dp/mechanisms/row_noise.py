"""Row-sparse Gaussian noise (core paper Algorithm 1, line 9).

``G_t = sum_i [g_i]_C2 + C2 * N(0, sigma2^2 * diag(1[V_t[j] >= tau]) (x) 1_d)``:
the clipped gradient sum restricted to the selected rows, plus Gaussian noise
of standard deviation ``sigma2 * C2`` on every coordinate of those rows and no
others. The result stays a ``tf.IndexedSlices`` over the selected rows, so the
optimizer's update is a scatter on them.
"""

from __future__ import annotations

import tensorflow as tf

from sparse_dp.mechanisms.sorted_ids import sorted_lookup


def add_row_sparse_noise(clipped_sum: tf.IndexedSlices, selected_rows: tf.Tensor,
                         noise_stddev: float, seed: tf.Tensor) -> tf.IndexedSlices:
  """Masks ``clipped_sum`` to ``selected_rows`` and noises every selected row.

  Args:
    clipped_sum: sum of clipped per-example gradients of one table; its indices
      may repeat (they are summed) and may include unselected rows (dropped).
    selected_rows: sorted, distinct int64 rows from
      :func:`sparse_dp.mechanisms.select_rows`.
    noise_stddev: ``sigma2 * C2``.
    seed: shape ``[2]`` integer seed.

  Returns:
    ``tf.IndexedSlices`` with one row per selected row, in ``selected_rows`` order.
  """
  selected_rows = tf.cast(selected_rows, tf.int64)
  indices = tf.cast(clipped_sum.indices, tf.int64)
  values = tf.convert_to_tensor(clipped_sum.values)
  num_selected = tf.size(selected_rows, out_type=tf.int64)
  slot, is_selected = sorted_lookup(selected_rows, indices)
  kept = tf.math.unsorted_segment_sum(
      tf.boolean_mask(values, is_selected), tf.boolean_mask(slot, is_selected), num_selected)
  noise_shape = tf.concat([[num_selected], tf.shape(values, out_type=tf.int64)[1:]], axis=0)
  noise = tf.random.stateless_normal(noise_shape, seed, stddev=noise_stddev, dtype=values.dtype)
  return tf.IndexedSlices(kept + noise, selected_rows, clipped_sum.dense_shape)
