"""The power of a one-run audit: the smallest true epsilon it flags 95% of the time.

A bound below the claim says little unless the audit could have seen a violation. This
module simulates an audit of ``m`` canaries with a fixed set of ``(k+, k-)`` tries on the
*ideal* mechanism for it: each canary's score is ``mu S_i + Z_i`` (``S_i in {0, 1}``,
``Z_i ~ N(0, 1)``), exactly ``(eps, delta)``-DP (:func:`gaussian_shift`; Steinke et al.,
NeurIPS 2023, §6). An audit *flags* a claim when its lower bound exceeds it; the *power* is
the smallest true ``eps`` flagged in at least ``rate`` of runs, found by bisection with common
random numbers. See docs/commands/audit.md ("How the audit computes").
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np
from scipy import optimize, stats

from sparse_dp.jobs.audit.bound import epsilon_lower_bound

LARGEST_EPSILON = 30.0  # searched up to; an audit that cannot flag below it has no power


def gaussian_delta(mu: float, epsilon: float) -> float:
  """``delta(eps)`` of ``N(mu, 1)`` against ``N(0, 1)`` (Balle and Wang, "Improving the
  Gaussian Mechanism for Differential Privacy", ICML 2018, Theorem 8):
  ``Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2)``."""
  return float(stats.norm.cdf(-epsilon / mu + mu / 2)
               - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2))


def gaussian_shift(epsilon: float, delta: float) -> float:
  """The shift ``mu`` at which ``N(mu, 1)`` vs ``N(0, 1)`` is exactly ``(epsilon, delta)``-DP."""
  if epsilon < 0 or not 0 < delta < 1:
    raise ValueError(f"need epsilon >= 0 and 0 < delta < 1, got {epsilon}, {delta}")
  return float(optimize.brentq(lambda mu: gaussian_delta(mu, epsilon) - delta, 1e-9, 1e3))


def flag_thresholds(pairs: Sequence[tuple[int, int]], canaries: int, delta: float,
                    per_try_beta: float, claim: float) -> np.ndarray:
  """``[P]``: per ``(k+, k-)`` the least right-guess count whose bound exceeds ``claim``
  (``k+ + k- + 1``, never reached, where even all right does not)."""
  thresholds = []
  for k_plus, k_minus in pairs:
    guesses = k_plus + k_minus
    low, high = 0, guesses + 1  # bound(low) <= claim; high: exceeds, or never
    while high - low > 1:
      middle = (low + high) // 2
      if epsilon_lower_bound(guesses, middle, canaries, delta, per_try_beta) > claim:
        high = middle
      else:
        low = middle
    thresholds.append(high)
  return np.asarray(thresholds)


class IdealAudit:
  """Simulated audits of the ideal mechanism with ``canaries`` and ``pairs`` (the run's tries).

  ``scores`` is the number of scores the run tries (each try pays ``beta / (pairs x
  scores)``); only one of them is simulated, the best an auditor could have.
  """

  def __init__(self, claim: float, canaries: int, delta: float, beta: float,
               pairs: Sequence[tuple[int, int]], scores: int = 1, trials: int = 1000,
               seed: int = 0):
    self.claim, self.canaries, self.delta = claim, canaries, delta
    self.pairs = list(pairs)
    self.thresholds = flag_thresholds(self.pairs, canaries, delta,
                                      beta / (len(self.pairs) * scores), claim)
    rng = np.random.default_rng(seed)
    self._included = rng.random((trials, canaries)) < 0.5
    self._noise = rng.standard_normal((trials, canaries))

  @property
  def included(self) -> np.ndarray:
    """``[trials, m]``: each simulated run's inclusion bits."""
    return self._included

  def scores(self, true_epsilon: float) -> np.ndarray:
    """``[trials, m]``: the ideal mechanism's scores, ``mu S + Z``, at ``true_epsilon``."""
    return gaussian_shift(true_epsilon, self.delta) * self._included + self._noise

  def flagged(self, true_epsilon: float) -> np.ndarray:
    """``[trials]``: whether each simulated audit's bound exceeds the claim."""
    order = np.argsort(self.scores(true_epsilon), axis=1)
    ranked = np.take_along_axis(self._included, order, axis=1)  # ascending score
    # included_in_top[:, k]: included among the k best; excluded_in_bottom likewise.
    included_in_top = np.concatenate(
        [np.zeros((len(ranked), 1), int), np.cumsum(ranked[:, ::-1], axis=1)], axis=1)
    excluded_in_bottom = np.concatenate(
        [np.zeros((len(ranked), 1), int), np.cumsum(~ranked, axis=1)], axis=1)
    correct = np.stack([included_in_top[:, k_plus] + excluded_in_bottom[:, k_minus]
                        for k_plus, k_minus in self.pairs], axis=1)
    return np.any(correct >= self.thresholds, axis=1)

  def flag_rate(self, true_epsilon: float) -> float:
    return float(self.flagged(true_epsilon).mean())

  def smallest_flagged_epsilon(self, rate: float = 0.95, tolerance: float = 0.01
                               ) -> Optional[float]:
    """The least true ``eps`` (to ``tolerance``, rounded up) flagged in ``rate`` of the runs;
    ``None`` if even :data:`LARGEST_EPSILON` is not."""
    low, high = self.claim, LARGEST_EPSILON
    if self.flag_rate(high) < rate:
      return None
    while high - low > tolerance:
      middle = (low + high) / 2
      low, high = (low, middle) if self.flag_rate(middle) >= rate else (middle, high)
    return round(math.ceil(high / tolerance) * tolerance, 6)
