"""DP-FEST's preselection over several tables: budget split, remapping, kept tables."""

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp.mechanisms.selection.preselection import preselect_buckets


def test_preselection_splits_epsilon_over_selected_tables_and_remaps():
  # Table 0 (6 buckets) keeps all at k = 8; tables 1 and 2 have clear top-2 buckets.
  counts = [tf.constant([5.0, 1, 1, 1, 1, 1]),
            tf.constant([0.0] * 50 + [1e6] + [0.0] * 48 + [1e6]),
            tf.constant([1e6, 1e6] + [0.0] * 30)]
  selection = preselect_buckets(counts, k=8, epsilon=1.0, seed=[1, 2])
  assert selection.remappings[0] is None and selection.vocabulary_sizes[0] == 6
  assert selection.epsilon == 1.0 and selection.vocabulary_sizes[1:] == (9, 9)
  selection = preselect_buckets(counts[1:], k=2, epsilon=1.0, seed=[1, 2])
  assert selection.kept_buckets == [[50, 99], [0, 1]]
  ids = np.array([[50, 1], [99, 0], [3, 7]])
  np.testing.assert_array_equal(selection.apply(ids), [[0, 1], [1, 0], [2, 2]])  # 2: OOV row


def test_nothing_to_select_costs_nothing_and_bad_input_is_named():
  selection = preselect_buckets([tf.ones(5), tf.ones(3)], k=5, epsilon=0.0, seed=[0, 0])
  assert selection.epsilon == 0.0 and selection.remappings == (None, None)
  with pytest.raises(ValueError, match="k"):
    preselect_buckets([tf.ones(5)], k=0, epsilon=1.0, seed=[0, 0])
  with pytest.raises(ValueError, match="epsilon"):
    preselect_buckets([tf.ones(5)], k=2, epsilon=0.0, seed=[0, 0])
  with pytest.raises(ValueError, match=r"shape \[examples, 1\]"):
    preselect_buckets([tf.ones(5)], k=2, epsilon=1.0, seed=[0, 0]).apply(np.zeros((3, 2)))
