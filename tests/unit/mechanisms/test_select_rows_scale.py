"""Selecting rows of a 1e9-row table costs memory proportional to the rows selected.

Speed is measured by ``benchmarks/select_rows.py``, not asserted here; this
test checks the property that makes it fast: no O(vocabulary) allocation.
"""

import resource

import numpy as np
import tensorflow as tf
from scipy import stats

from sparse_dp.mechanisms import contribution_maps, false_positive_probability, select_rows

from support.stacks import ALPHA

VOCABULARY = 1_000_000_000


def peak_rss_mb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_billion_row_table_selection_is_sparse(seed):
  tau, noise_std = 5.0, 1.414
  ids = tf.constant(np.random.default_rng(0).zipf(1.1, 1024) % VOCABULARY, tf.int64)

  @tf.function
  def step(seed):
    (contribution,) = contribution_maps([ids], 1.0)
    return select_rows(contribution, VOCABULARY, tau, noise_std, seed)

  step(seed)  # trace outside the measurement
  before = peak_rss_mb()
  selection = step(seed + 1)
  grown = peak_rss_mb() - before
  # A dense boolean mask alone would be 1000 MB, a float32 noise vector 4000 MB.
  assert grown < 100, f"selection grew peak memory by {grown:.0f} MB"
  p = false_positive_probability(tau, noise_std)
  zero_rows = VOCABULARY - len(np.unique(ids.numpy()))
  low, high = stats.binom.ppf(ALPHA / 2, zero_rows, p), stats.binom.isf(ALPHA / 2, zero_rows, p)
  assert low <= int(selection.num_false_positives) <= high
  assert int(selection.selected_rows()[-1]) < VOCABULARY
