"""Row-sparse noise has std sigma2 * C2 on exactly the selected rows."""

import numpy as np
import tensorflow as tf
from scipy import stats

from sparse_dp.mechanisms import add_row_sparse_noise

from support.stacks import ALPHA

SIGMA2, C2 = 1.3, 0.7


def test_noise_on_selected_rows_has_std_sigma2_c2(seed):
  vocabulary, dim = 1_000_000, 64
  selected = tf.constant(np.sort(np.random.default_rng(0).choice(vocabulary, 2000, replace=False)))
  # A clipped sum touching 3 selected rows and 2 rows that were not selected.
  signal_rows = tf.concat([selected[:3],
                           tf.constant([vocabulary - 1, vocabulary - 2], tf.int64)], 0)
  clipped = tf.IndexedSlices(tf.fill([5, dim], 0.25), signal_rows, [vocabulary, dim])
  noisy = add_row_sparse_noise(clipped, selected, SIGMA2 * C2, seed)

  np.testing.assert_array_equal(noisy.indices.numpy(), selected.numpy())
  noise = noisy.values.numpy().copy()
  noise[:3] -= 0.25  # the selected signal passes through; unselected rows are dropped
  n, std = noise.size, SIGMA2 * C2
  scaled_sum_of_squares = np.sum(noise ** 2) / std ** 2  # ~ chi2(n)
  assert stats.chi2.ppf(ALPHA / 2, n) <= scaled_sum_of_squares <= stats.chi2.isf(ALPHA / 2, n)
  assert abs(noise.mean()) <= stats.norm.isf(ALPHA / 2) * std / np.sqrt(n)


def test_repeated_gradient_indices_are_summed_and_nothing_else_is_noised(seed):
  clipped = tf.IndexedSlices(tf.ones([3, 2]), tf.constant([5, 5, 9], tf.int64), [10, 2])
  exact = add_row_sparse_noise(clipped, tf.constant([1, 5], tf.int64), 0.0, seed)
  np.testing.assert_array_equal(exact.values.numpy(), [[0, 0], [2, 2]])
  nothing = add_row_sparse_noise(clipped, tf.zeros([0], tf.int64), 1.0, seed)
  assert nothing.values.shape == (0, 2)
