"""Thresholding selects rows at the rates Psi((tau - V) / (sigma1 C1)) predicts."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from conftest import ALPHA
from sparse_dp.mechanisms import (ContributionMap, bernoulli_positions,
                                  false_positive_probability, sample_zero_rows,
                                  select_rows)
from sparse_dp.mechanisms import row_selection


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
  rows = selection.rows.numpy()
  assert np.all(np.diff(rows) > 0) and rows[0] >= 0 and rows[-1] < vocabulary
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


@pytest.mark.parametrize("chunk_sigmas", [row_selection._CHUNK_SIGMAS, -3.0])
def test_geometric_skips_match_dense_bernoulli_reference(seed, monkeypatch, chunk_sigmas):
  # chunk_sigmas = -3 makes the first batch of gaps too short, so the sampler
  # must continue with further batches.
  monkeypatch.setattr(row_selection, "_CHUNK_SIGMAS", chunk_sigmas)
  vocabulary, p, trials = 40, 0.15, 4000
  excluded = tf.constant([0, 7, 8, 20, 39], tf.int64)
  zero_rows = np.setdiff1d(np.arange(vocabulary), excluded.numpy())
  geometric = tf.function(lambda s: sample_zero_rows(excluded, vocabulary, p, s))
  skip = _selection_counts(lambda t: geometric(seed + t).numpy(), trials, vocabulary)
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
  everything = sample_zero_rows(tf.constant([2, 5], tf.int64), 8, 0.999999, seed).numpy()
  np.testing.assert_array_equal(everything, [0, 1, 3, 4, 6, 7])
  with pytest.raises(ValueError, match="tau must be > 0"):
    select_rows(ContributionMap(tf.zeros([0], tf.int64), tf.zeros([0])), 10, 0.0, 1.0, seed)
