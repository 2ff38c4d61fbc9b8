"""RONA's parts: the epsilon of its answered batches, its noised answers, its query selection."""

import math

import numpy as np
import pytest
from scipy import stats

from sparse_dp.jobs.distill.rona import privacy as rona_privacy
from sparse_dp.jobs.distill.rona.answers import NoisyAnswers, clip_rows
from sparse_dp.jobs.distill.rona.query_selection import bernoulli_kl, select_queries

from support.gaussian_composition import gaussians_epsilon
from support.stacks import ALPHA


def test_rona_epsilon_grows_with_the_queries():
  class Args:  # the flags RonaSchedule reads
    query_batch_size, hint_epochs, rounds, distill_epochs, self_epochs = 50, 1, 2, 1, 1
  few, more = Args(), Args()
  few.query_share, more.query_share = 0.5, 1.0
  schedules = [rona_privacy.RonaSchedule.from_args(a, 300) for a in (few, more)]
  assert [s.answered_batches for s in schedules] == [9, 18]
  epsilons = [rona_privacy.rona_epsilon(40.0, [50] * s.answered_batches, 1e-5)
              for s in schedules]
  assert epsilons[0] == pytest.approx(gaussians_epsilon(40 / (2 * math.sqrt(50)), 9, 1e-5))
  assert epsilons[1] == pytest.approx(gaussians_epsilon(40 / (2 * math.sqrt(50)), 18, 1e-5))
  assert epsilons[1] > 1.2 * epsilons[0]
  sigma = rona_privacy.calibrate_sigma(3.0, 1e-5, 50, 18)
  assert 2.95 < rona_privacy.rona_epsilon(sigma, [50] * 18, 1e-5) <= 3.0


def test_teacher_answers_are_clipped_and_noised_at_sigma_c():
  """The noise is N(0, (sigma C)^2) per coordinate, independent of the answers."""
  rng = np.random.default_rng(0)
  values = rng.normal(0, 5, (400, 50))  # norms ~35, far above the clip
  sigma, clip = 3.0, 2.0
  answers = NoisyAnswers(sigma, noise_seed=11)
  noisy = answers.answer(values, clip)
  clipped = clip_rows(values, clip)
  assert np.allclose(np.linalg.norm(clipped, axis=1), clip)
  small = rng.normal(0, 0.01, (4, 50))
  assert np.array_equal(clip_rows(small, clip), small)
  standardized = ((noisy - clipped) / (sigma * clip)).ravel()  # 20,000 draws
  # Two-sided tests, each at ALPHA / 2: the variance (chi-square) and the shape (KS).
  chi2 = float(np.sum(standardized ** 2))
  n = standardized.size
  assert stats.chi2.ppf(ALPHA / 4, n) < chi2 < stats.chi2.ppf(1 - ALPHA / 4, n)
  assert stats.kstest(standardized, "norm").pvalue > ALPHA / 2
  assert answers.batch_sizes == [400] and answers.clips == [clip]
  # A noise 10% too small fails the variance test (its power at this size is ~1).
  assert np.sum((standardized * 0.9) ** 2) < stats.chi2.ppf(ALPHA / 4, n)


def test_query_selection_is_algorithm_3():
  """Greedy farthest-point by KL of the student's outputs, as a direct O(N^2) reading."""
  p = np.random.default_rng(1).beta(2, 5, 60)
  chosen = select_queries(p, 12, np.random.default_rng(7))
  order = np.random.default_rng(7).permutation(60)
  expected = [order[0]]
  for _ in range(11):
    rest = [i for i in order if i not in expected]
    expected.append(max(rest, key=lambda i: min(bernoulli_kl(p[i:i + 1], p[j])[0]
                                                for j in expected)))
  assert list(chosen) == expected
  assert np.argmin(p) in chosen and np.argmax(p) in chosen
