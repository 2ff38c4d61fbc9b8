"""Thresholding selects rows at the rates Psi((tau - V) / (sigma1 C1)) predicts."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from sparse_dp.mechanisms import (
  PAD,
  ContributionMap,
  bernoulli_positions,
  false_positive_capacity,
  false_positive_probability,
  padded_bernoulli_positions,
  sample_zero_rows,
  select_rows,
)
from sparse_dp.mechanisms.randomness.exponential import exponential_from_bits
from sparse_dp.mechanisms.selection import row_selection

from support.stacks import ALPHA


def binomial_interval(n, p):
  return stats.binom.ppf(ALPHA / 2, n, p), stats.binom.isf(ALPHA / 2, n, p)


def test_zero_count_rows_are_selected_at_rate_psi(seed):
  vocabulary, tau, sigma1, c1 = 10_000_000, 3.0, 2.0, 0.5
  contributed = np.sort(np.random.default_rng(1).choice(vocabulary, 1000, replace=False))
  contribution = ContributionMap(tf.constant(contributed), tf.fill([1000], 100.0))
  selection = select_rows(contribution, vocabulary, tau, sigma1 * c1, seed)

  p = stats.norm.sf(tau / (sigma1 * c1))
  assert false_positive_probability(tau, sigma1 * c1) == pytest.approx(p)
  low, high = binomial_interval(vocabulary - 1000, p)
  assert low <= int(selection.num_false_positives) <= high
  rows = selection.selected_rows().numpy()
  assert np.all(np.diff(rows) > 0) and rows[0] >= 0 and rows[-1] < vocabulary
  # The rest of the fixed-capacity buffer is padding.
  assert np.all(selection.rows.numpy()[len(rows):] == PAD) and not selection.over_capacity
  # Contributions of 100 always pass; every other selected row is a false positive.
  assert int(selection.num_true_positives) == 1000 and int(selection.num_dropped) == 0
  assert np.isin(contributed, rows).all()
  assert len(rows) == 1000 + int(selection.num_false_positives)


@pytest.mark.parametrize("offset_in_stds,probability", [(0.0, 0.5), (1.0, stats.norm.sf(-1.0))])
def test_contributed_rows_pass_at_rate_psi_of_gap(seed, offset_in_stds, probability):
  n, tau, std = 20_000, 5.0, 1.5
  contribution = ContributionMap(tf.range(n, dtype=tf.int64),
                                 tf.fill([n], tau + offset_in_stds * std))
  selection = select_rows(contribution, n, tau, std, seed)
  low, high = binomial_interval(n, probability)
  assert low <= int(selection.num_true_positives) <= high
  assert int(selection.num_true_positives + selection.num_dropped) == n


def _selection_counts(sampler, trials, vocabulary):
  counts = np.zeros((trials, vocabulary), bool)
  for t in range(trials):
    counts[t, sampler(t)] = True
  return counts


def _padded_zero_rows(excluded, vocabulary, p):
  capacity = false_positive_capacity(vocabulary, p)
  sample = tf.function(lambda s: sample_zero_rows(excluded, vocabulary, p, s, capacity)[0])
  return lambda s: [r for r in sample(s).numpy() if r != PAD]


def _chunked_zero_rows(excluded, vocabulary, p):
  # bernoulli_positions (the Poisson sampler's) over the zero rows, with a first
  # batch of gaps too short (chunk_sigmas = -3): it must continue with further batches.
  zero_rows = np.setdiff1d(np.arange(vocabulary), excluded.numpy())
  sample = tf.function(lambda s: bernoulli_positions(len(zero_rows), p, s))
  return lambda s: zero_rows[sample(s).numpy()]


@pytest.mark.parametrize("sampler", [_padded_zero_rows, _chunked_zero_rows])
def test_geometric_skips_match_dense_bernoulli_reference(seed, monkeypatch, sampler):
  monkeypatch.setattr(row_selection, "_CHUNK_SIGMAS", -3.0)
  vocabulary, p, trials = 40, 0.15, 4000
  excluded = tf.constant([0, 7, 8, 20, 39], tf.int64)
  zero_rows = np.setdiff1d(np.arange(vocabulary), excluded.numpy())
  geometric = sampler(excluded, vocabulary, p)
  skip = _selection_counts(lambda t: geometric(seed + t), trials, vocabulary)
  uniform = tf.random.stateless_uniform([trials, vocabulary], seed + 10**6).numpy()
  dense = (uniform < p) & np.isin(np.arange(vocabulary), zero_rows)

  assert not skip[:, excluded.numpy()].any()
  # Per-row inclusion frequencies: one population (2 x rows contingency table).
  table = np.stack([skip[:, zero_rows].sum(0), dense[:, zero_rows].sum(0)])
  table = np.concatenate([table, trials - table], axis=1)
  assert stats.chi2_contingency(table)[1] > ALPHA
  # Number selected per draw, and adjacent rows selected together.
  assert stats.ks_2samp(skip.sum(1), dense.sum(1)).pvalue > ALPHA
  def adjacent_pairs(selected):
    return (selected[:, zero_rows[:-1]] & selected[:, zero_rows[:-1] + 1]).sum()
  both = np.array([adjacent_pairs(skip), adjacent_pairs(dense)])
  opportunities = trials * (len(zero_rows) - 1)
  assert stats.chi2_contingency(np.stack([both, opportunities - both]))[1] > ALPHA
  # And the exact Binomial law of the count.
  expected = stats.binom.pmf(np.arange(len(zero_rows) + 1), len(zero_rows), p) * trials
  observed = np.bincount(skip.sum(1), minlength=len(zero_rows) + 1)
  keep = expected >= 5
  obs = np.append(observed[keep], observed[~keep].sum())
  exp = np.append(expected[keep], expected[~keep].sum())
  assert stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > ALPHA


def test_edge_cases(seed):
  assert bernoulli_positions(0, 0.3, seed).shape == (0,)
  assert bernoulli_positions(10**9, 0.0, seed).shape == (0,)
  everything, over = sample_zero_rows(tf.constant([2, 5], tf.int64), 8, 0.999999, seed,
                                     false_positive_capacity(8, 0.999999))
  np.testing.assert_array_equal(everything.numpy(), [0, 1, 3, 4, 6, 7, PAD, PAD])
  assert not over
  with pytest.raises(ValueError, match="tau must be > 0"):
    select_rows(ContributionMap(tf.zeros([0], tf.int64), tf.zeros([0])), 10, 0.0, 1.0, seed)


def _count_at_least(function, level, bits_dtype=tf.uint64):
  """How many of the 2^64 inputs k have function(k) >= level, for a decreasing function."""
  low, high = 0, 2 ** 64  # function(k) >= level exactly for k < answer
  while low < high:
    middle = (low + high) // 2
    if function(tf.constant([middle], bits_dtype)).numpy()[0] >= level:
      low = middle + 1
    else:
      high = middle
  return low


@pytest.mark.parametrize("gap_in_stds", [-9.0, -6.0, -1.0, 0.0, 2.0, 6.0, 7.5, 9.0])
def test_contributed_row_passes_with_exact_tail_probability(gap_in_stds):
  # A row passes iff E >= -log Psi(x), E the Exp(1) quantile of (k + 1/2) 2^-64
  # for uniform 64-bit k: its pass probability is (number of such k) / 2^64,
  # exactly. A float32 Gaussian draw never exceeds ~5.7 standard deviations, so
  # it would give 0 where x >= 6 (Psi(6) = 1e-9) and 1 where x <= -6.
  level = float(row_selection.negative_log_survival(tf.constant(gap_in_stds)))
  assert level == pytest.approx(-stats.norm.logsf(gap_in_stds), rel=1e-12)
  passing = _count_at_least(exponential_from_bits, level)
  assert abs(passing - stats.norm.sf(gap_in_stds) * 2.0 ** 64) <= 2 + 1e-9 * passing
  failing = 2 ** 64 - passing
  assert abs(failing - stats.norm.cdf(gap_in_stds) * 2.0 ** 64) <= 2 + 1e-9 * failing


def test_exponential_tails_reach_the_float64_grid():
  extremes = exponential_from_bits(tf.constant([0, 2 ** 63, 2 ** 64 - 1], tf.uint64)).numpy()
  np.testing.assert_allclose(extremes, [65 * np.log(2), np.log(2), 2.0 ** -65], rtol=1e-12)
  assert row_selection.negative_log_survival(tf.constant(40.0)).numpy() == np.inf
  # Zero contributions just above 0 pass at the rate of untouched rows.
  assert float(tf.exp(-row_selection.negative_log_survival(tf.constant(4.0)))) == pytest.approx(
      false_positive_probability(4.0, 1.0), rel=1e-12)


def test_huge_vocabulary_with_tiny_probability(seed):
  vocabulary, p = 10 ** 12, 1e-9
  positions = bernoulli_positions(vocabulary, p, seed).numpy()
  low, high = binomial_interval(vocabulary, p)
  assert low <= len(positions) <= high
  assert np.all(np.diff(positions) > 0) and positions[0] >= 0 and positions[-1] < vocabulary
  rows = select_rows(ContributionMap(tf.constant([5, 10 ** 11], tf.int64), tf.constant([9.0, 9.0])),
                     10 ** 12, 6.0, 1.0, seed).selected_rows().numpy()
  assert {5, 10 ** 11} <= set(rows.tolist()) and rows[-1] < 10 ** 12


def test_more_positions_than_int32_are_sized_in_int64_or_refused(seed):
  # The gap batch for 2^31 expected positions exceeds int32 (it used to wrap).
  assert int(row_selection.gap_batch_size(2 ** 32, 0.5)) == int(np.ceil(
      2 ** 31 + 6 * np.sqrt(2 ** 31 * 0.5) + 16))
  with pytest.raises(ValueError, match="more than 2,147,483,648 positions"):
    bernoulli_positions(2 ** 40, 0.01, seed)
  dynamic = tf.function(lambda n: bernoulli_positions(n, 0.01, seed))
  with pytest.raises(tf.errors.InvalidArgumentError, match="more than 2,147,483,648") as refused:
    dynamic(tf.constant(2 ** 40 + 12_345, tf.int64))
  # Neither the length nor length x p: a length may count the rows a batch did not touch.
  assert "1099511640" not in str(refused.value) and "109951164" not in str(refused.value)
  with pytest.raises(ValueError, match=r"threshold tau = 0.5 is only 0.5 times .*raise tau"):
    select_rows(ContributionMap(tf.zeros([0], tf.int64), tf.zeros([0])), 10 ** 10, 0.5, 1.0, seed)


def test_probability_one_keeps_every_position(seed):
  np.testing.assert_array_equal(bernoulli_positions(5, 1.0, seed).numpy(), [0, 1, 2, 3, 4])
  with pytest.raises(ValueError, match=r"in \[0, 1\]"):
    bernoulli_positions(5, 1.5, seed)


def test_capacity_bounds_the_false_positive_tail():
  for vocabulary, p in [(10 ** 7, 3e-5), (1000, 3e-5), (10 ** 5, 0.2), (50, 0.5)]:
    capacity = false_positive_capacity(vocabulary, p)
    assert stats.binom.sf(capacity, vocabulary, p) <= row_selection.FALSE_POSITIVE_OVERFLOW
    assert capacity <= vocabulary
  assert false_positive_capacity(10, 0.0) == 0 and false_positive_capacity(10, 1.0) == 10


def test_padded_positions_are_the_first_batch_of_the_chunked_sampler(seed):
  length, p = 10 ** 6, 1e-3
  capacity = false_positive_capacity(length, p)
  padded, over = padded_bernoulli_positions(length, p, capacity, seed)
  padded = padded.numpy()
  np.testing.assert_array_equal(padded[padded != PAD], bernoulli_positions(length, p, seed).numpy())
  assert not over and padded.shape == (capacity,)


def test_more_positions_than_the_capacity_are_flagged(seed):
  positions, over = padded_bernoulli_positions(1000, 0.5, 10, seed)
  assert bool(over) and np.all(positions.numpy() != PAD)
  _, fits = padded_bernoulli_positions(1000, 0.5, 1000, seed)
  assert not fits


def test_the_selection_compiles_with_xla_to_the_same_rows(seed):
  rows = tf.constant([3, 17, 40, 41, PAD, PAD], tf.int64)
  contribution = ContributionMap(rows, tf.constant([0.5, 2.0, 1.0, 3.0, 0.0, 0.0]))

  def select(seed):
    return select_rows(contribution, 10 ** 6, 1.0, 0.4, seed)

  graph = tf.function(select)(seed)
  compiled = tf.function(select, jit_compile=True)(seed)
  for a, b in zip(graph, compiled):
    np.testing.assert_array_equal(a.numpy(), b.numpy())
  assert graph.rows.shape == (6 + false_positive_capacity(10 ** 6, stats.norm.sf(2.5)),)
