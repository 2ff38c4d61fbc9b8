"""The one-run epsilon lower bound (Steinke, Nasr, Jagielski, NeurIPS 2023).

"Privacy Auditing with One (1) Training Run" (arXiv 2305.08846): ``m`` canaries, each included
with probability 1/2; the auditor makes ``r`` guesses (included, excluded or abstain) from the
output alone, ``W`` of them right. Under ``eps``-DP, ``W`` is dominated by ``Binomial(r, p)``,
``p = e^eps / (1 + e^eps)``; with ``f_eps(v) = P[Binomial(r, p) >= v]``, under
``(eps, delta)``-DP ``P[W >= v] <= f_eps(v) + 2 m delta max_i (f_eps(v - i) - f_eps(v)) / i``.
The lower bound is the least ``eps`` the observed count does not reject at level ``beta``
(closed form with ``delta = 0``; a grid of step 0.01 upward from 0 with ``delta > 0``).
``tests/unit/jobs/test_audit_bound.py`` checks the numbers against the paper's Appendix D code
(``get_eps_audit``), a direct binomial tail and an epsilon = 0 null. The number of canaries
caps what an audit can show (:mod:`sparse_dp.jobs.audit.power`). See docs/commands/audit.md
("How the audit computes").
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats
from scipy.special import betaincinv, expit

_GRID_STEP = 0.01


def binomial_tail(eps: float, guesses: int, correct: int) -> float:
  """``f_eps(correct) = P[Binomial(guesses, e^eps / (1 + e^eps)) >= correct]``."""
  return float(stats.binom.sf(correct - 1, guesses, expit(eps)))


def tail_bound(eps, guesses: int, correct: int, canaries: int, delta: float) -> np.ndarray:
  """The theorem's bound on ``P[W >= correct]`` for ``(eps, delta)``-DP training.

  ``eps`` may be an array (one bound per value).
  """
  eps = np.atleast_1d(np.asarray(eps, float))[:, None]
  p = expit(eps)
  at_v = stats.binom.sf(correct - 1, guesses, p)  # [E, 1]
  if delta == 0 or correct <= 0:
    return at_v[:, 0]
  shifts = np.arange(1, min(canaries, correct) + 1)  # beyond v, f(v - i) = 1 falls with i
  below = stats.binom.sf(correct - shifts - 1, guesses, p)  # [E, I]
  slope = np.max((below - at_v) / shifts, axis=1)
  return at_v[:, 0] + 2 * canaries * delta * slope


def epsilon_lower_bound(guesses: int, correct: int, canaries: int, delta: float,
                        beta: float) -> float:
  """The smallest ``eps >= 0`` that ``correct`` of ``guesses`` right does not reject at ``beta``.

  This is the one-run lower bound of Steinke, Nasr and Jagielski (NeurIPS 2023).
  Under ``eps``-DP, the count ``W`` of right guesses is dominated by ``Binomial(r, p)``, with
  ``p = e^eps / (1 + e^eps)``.
  Let ``f_eps(v) = P[Binomial(r, p) >= v]``.
  Under ``(eps, delta)``-DP,
  ``P[W >= v] <= f_eps(v) + 2 m delta max_i (f_eps(v - i) - f_eps(v)) / i``.
  With ``delta = 0`` the bound has a closed form (the Clopper-Pearson lower limit).
  With ``delta > 0`` it is searched on a grid of step 0.01 upward from 0.

  Args:
    guesses: ``r``, the guesses made (the canaries not abstained on).
    correct: ``v``, the right guesses.
    canaries: ``m``, which enters only through the delta term.
    delta: the ``delta`` of the training's DP guarantee, in ``[0, 1)``.
    beta: the test's level, in ``(0, 1)``.

  Returns:
    The lower bound; 0 when even ``eps = 0`` is not rejected.

  Raises:
    ValueError: not ``0 <= correct <= guesses <= canaries``; ``delta`` outside ``[0, 1)``;
      or ``beta`` outside ``(0, 1)``.
  """
  _check(guesses, correct, canaries, delta, beta)
  if guesses == 0 or binomial_tail(0.0, guesses, correct) > beta:
    return 0.0
  pure = _pure_bound(guesses, correct, beta)
  if delta == 0:
    return pure
  # The delta term only adds to the tail: the bound is at most the pure one.
  grid = np.arange(0.0, pure + _GRID_STEP, _GRID_STEP)
  accepted = np.flatnonzero(tail_bound(grid, guesses, correct, canaries, delta) > beta)
  if not accepted.size:
    return pure
  return float(grid[accepted[0] - 1]) if accepted[0] > 0 else 0.0  # the last rejected


def _pure_bound(guesses: int, correct: int, beta: float) -> float:
  """``f_eps(correct) = beta`` solved exactly: ``P[Binomial(r, p) >= v] = I_p(v, r - v + 1)``
  (the regularised incomplete beta function), so ``p = I^{-1}_beta(v, r - v + 1)``
  (the Clopper-Pearson lower limit) and ``eps = log(p / (1 - p))``."""
  p = float(betaincinv(correct, guesses - correct + 1, beta))
  return math.log(p / (1.0 - p))


def _check(guesses, correct, canaries, delta, beta) -> None:
  if not 0 <= correct <= guesses <= canaries:
    raise ValueError(f"need 0 <= correct ({correct}) <= guesses ({guesses}) <= canaries "
                     f"({canaries})")
  if not 0 <= delta < 1:
    raise ValueError(f"delta must be in [0, 1), got {delta}")
  if not 0 < beta < 1:
    raise ValueError(f"beta (1 - confidence) must be in (0, 1), got {beta}")
