"""Gumbel top-k selects like k peeling picks of the exponential mechanism."""

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from sparse_dp.accounting import TopKSelectionCost
from sparse_dp.mechanisms import BucketRemapping, bucket_counts, dp_top_k, public_top_k
from sparse_dp.mechanisms.selection.top_k import gumbel_noise

from support.stacks import ALPHA


def peeling_exponential_mechanism(counts, k, epsilon_per_pick):
  """Exact probability of each k-set under k sequential picks, each w.p. ~ exp(eps * count)."""
  probabilities = {}
  for order in itertools.permutations(range(len(counts)), k):
    remaining, p = list(range(len(counts))), 1.0
    for pick in order:
      weights = np.exp(epsilon_per_pick * np.asarray(counts, float)[remaining])
      p *= np.exp(epsilon_per_pick * counts[pick]) / weights.sum()
      remaining.remove(pick)
    key = tuple(sorted(order))
    probabilities[key] = probabilities.get(key, 0.0) + p
  return probabilities


def test_gumbel_top_k_matches_exponential_mechanism(seed):
  counts, k, epsilon, trials = [6.0, 4.0, 3.0, 1.0, 0.0], 2, 2.0, 40_000
  exact = peeling_exponential_mechanism(counts, k, epsilon / k)  # scale b = k / epsilon
  picks = dp_top_k(tf.tile([counts], [trials, 1]), k, epsilon, seed).numpy()
  observed = {key: 0 for key in exact}
  for row in map(tuple, picks):
    observed[row] += 1
  keys = sorted(exact)
  assert stats.chisquare([observed[x] for x in keys],
                         [exact[x] * trials for x in keys]).pvalue > ALPHA
  # Inclusion frequency of each bucket, as the issue states it.
  inclusion = np.bincount(picks.ravel(), minlength=5) / trials
  expected = [sum(p for key, p in exact.items() if b in key) for b in range(5)]
  np.testing.assert_allclose(inclusion, expected, atol=5 * np.sqrt(0.25 / trials))


def test_gumbel_noise_reaches_past_the_float32_ceiling(seed):
  # -log(-log U) of a float32 uniform below 1 never exceeds -log(2^-23) = 15.94:
  # a bucket 20 scales behind another could never be picked. The true Gumbel
  # exceeds 15.95 w.p. 1.2e-7: 16 times expected in 2^27 draws.
  threshold, chunks, size = 15.95, 8, 2 ** 24
  rate = -math.expm1(-math.exp(-threshold))
  above = sum(int(tf.math.count_nonzero(gumbel_noise([size], 1.0, seed + [0, i]) > threshold))
              for i in range(chunks))
  n = chunks * size
  assert stats.binom.ppf(ALPHA / 2, n, rate) <= above <= stats.binom.isf(ALPHA / 2, n, rate)
  assert gumbel_noise([4], 2.0, seed).dtype == tf.float64


def test_per_feature_budget_sets_the_scale(seed):
  cost = TopKSelectionCost.split_evenly(0.02, [2, 2])
  counts = tf.constant([50.0, 0.0, 40.0, 0.0, 30.0])
  # Scale k / epsilon_f = 200: the counts barely matter, every 2-set is likely.
  noisy = dp_top_k(tf.tile([counts], [2000, 1]), 2, cost.epsilons[0], seed).numpy()
  assert len({tuple(r) for r in noisy}) == 10
  # With a huge epsilon the selection is the exact top-k.
  np.testing.assert_array_equal(dp_top_k(counts, 2, 1e6, seed).numpy(), [0, 2])
  np.testing.assert_array_equal(public_top_k(counts, 3).numpy(), [0, 2, 4])
  with pytest.raises(ValueError, match="exceeds the vocabulary"):
    public_top_k(counts, 6)


def test_bucket_counts_count_examples_not_occurrences():
  ids = tf.ragged.constant([[1, 1, 1, 3], [3], []], tf.int64)
  np.testing.assert_array_equal(bucket_counts(ids, 5).numpy(), [0, 1, 0, 2, 0])
  for run in (bucket_counts, tf.function(bucket_counts)):
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"outside the vocabulary \[0, 5\)"
                       ) as error:
      run(tf.constant([987654], tf.int64), 5)
    assert "987654" not in str(error.value)  # the ids are the private data
    with pytest.raises(tf.errors.InvalidArgumentError, match="must be >= 0") as error:
      run(tf.constant([-987654], tf.int64), 5)
    assert "987654" not in str(error.value)


def test_remapping_sends_kept_buckets_to_dense_ids_and_the_rest_to_oov(tmp_path):
  remap = BucketRemapping([900, 12, 77])
  assert remap.vocabulary_size == 4 and remap.oov_id == 3
  np.testing.assert_array_equal(remap(tf.constant([12, 13, 900, 77, 0])).numpy(), [0, 3, 2, 1, 3])
  ragged = remap(tf.ragged.constant([[77, 5], []], tf.int64))
  assert ragged.to_list() == [[1, 3], []]
  sparse = remap(tf.sparse.from_dense(tf.constant([[0, 900]], tf.int64)))
  np.testing.assert_array_equal(sparse.values.numpy(), [2])
  # Serialises as plain TF ops.
  module = tf.Module()
  module.remap = remap
  module.call = tf.function(lambda ids: remap(ids),
                            input_signature=[tf.TensorSpec([None], tf.int64)])
  tf.saved_model.save(module, str(tmp_path))
  restored = tf.saved_model.load(str(tmp_path))
  np.testing.assert_array_equal(restored.call(tf.constant([77, 1], tf.int64)).numpy(), [1, 3])
  with pytest.raises(ValueError, match="repeated"):
    BucketRemapping([1, 1])
