"""Guesses from canary scores and the one-run audit over them (Steinke et al., NeurIPS 2023, §3).

The auditor ranks the ``m`` canaries by a score, guesses *included* for the ``k+`` highest,
*excluded* for the ``k-`` lowest and abstains on the rest; ties are broken by a public random
order from ``tie_seed``, never from the inclusion bits. Every ``(score, k+, k-)`` tried is its
own test at ``beta / tries`` (a union bound), so the largest bound over the tries holds with
probability ``1 - beta``. The tries are fixed in advance: ``k+ = k- = k`` for ``k`` in
:data:`K_FRACTIONS` of ``m``, up to ``m / 2`` per side, and ``(k, 0)`` for the two largest.
See docs/commands/audit.md ("How the audit computes").
"""

from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from sparse_dp.jobs.audit.bound import epsilon_lower_bound

K_FRACTIONS = (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2)


@dataclasses.dataclass(frozen=True)
class Guesses:
  """One try: the guesses of one score at one ``(k+, k-)`` and what they reach."""

  score: str
  k_plus: int
  k_minus: int
  correct: int
  epsilon_lower_bound: float

  @property
  def guesses(self) -> int:
    return self.k_plus + self.k_minus


@dataclasses.dataclass(frozen=True)
class OneRunAudit:
  """The one-run audit's tries, every bound at confidence ``1 - beta``.

  Each try is the guesses of one score at one ``(k+, k-)``.
  The largest bound over the tries holds with probability ``1 - beta``.

  Attributes:
    tries: every try, with its correct guesses and its epsilon lower bound.
    beta: one minus the confidence of the bounds.
    delta: the ``delta`` of the DP guarantee the bounds are computed for.
    canaries: the number of canaries ``m``.
  """

  tries: tuple[Guesses, ...]
  beta: float
  delta: float
  canaries: int

  def best(self, score: str | None = None) -> Guesses:
    """The try of the largest bound.

    Args:
      score: the name of a score; ``None``, the default, looks over all scores.

    Returns:
      The try of the largest bound; of two with the same bound, the one with fewer wrong
        guesses.
    """
    tries = [t for t in self.tries if score is None or t.score == score]
    return max(tries, key=lambda t: (t.epsilon_lower_bound, t.correct - t.guesses))

  @property
  def epsilon_lower_bound(self) -> float:
    """The largest bound over all tries: the audit's epsilon lower bound."""
    return self.best().epsilon_lower_bound


def k_pairs(canaries: int, fractions: Sequence[float] = K_FRACTIONS) -> list[tuple[int, int]]:
  """``(k+, k-)``: ``(k, k)`` for ``k = max(1, round(f m))`` (distinct, at most ``m / 2``),
  then ``(k, 0)`` for the two largest ``k``."""
  ks = sorted({max(1, min(round(f * canaries), canaries // 2)) for f in fractions})
  return [(k, k) for k in ks] + [(k, 0) for k in ks[-2:]]


def correct_guesses(scores: np.ndarray, included: np.ndarray, k_plus: int, k_minus: int,
                    tie_order: np.ndarray) -> int:
  """Right guesses: included among the ``k+`` top scores plus excluded among the ``k-`` bottom."""
  order = np.lexsort((tie_order, scores))  # ascending score, ties in the public random order
  top = order[len(order) - k_plus:] if k_plus else order[:0]
  return int(included[top].sum() + (~included[order[:k_minus]]).sum())


def audit(scores: Mapping[str, np.ndarray], included: np.ndarray, delta: float,
          beta: float = 0.05, tie_seed: int = 0,
          pairs: Sequence[tuple[int, int]] | None = None) -> OneRunAudit:
  """The one-run audit of canary scores against the secret inclusion bits.

  It is the audit of Steinke, Nasr and Jagielski (NeurIPS 2023, §3).
  The auditor ranks the ``m`` canaries by a score.
  It guesses *included* for the ``k+`` highest and *excluded* for the ``k-`` lowest, and
  abstains on the rest.
  Ties are broken by a public random order from ``tie_seed``, never from the inclusion bits.
  Every ``(score, k+, k-)`` tried is its own test at ``beta / tries`` (a union bound).
  So the largest bound over the tries holds with probability ``1 - beta``.

  Args:
    scores: ``{name: [m] scores}``, a higher score meaning a better fit.
    included (array-like of bool): ``[m]``, whether each canary was in the training data.
    delta: the ``delta`` of the training's DP guarantee.
    beta: one minus the confidence of the bound.
    tie_seed: the seed of the public random order that breaks ties.
    pairs: the ``(k+, k-)`` to try. The default is ``k+ = k- = k`` for ``k`` in
      :data:`K_FRACTIONS` of ``m``, up to ``m / 2`` per side, then ``(k, 0)`` for the two
      largest.

  Returns:
    Every try with its bound.

  Raises:
    ValueError: fewer than 2 canaries, or a score that is not ``m`` finite numbers; or a
      ``delta`` or ``beta`` out of range.
  """
  included = np.asarray(included, bool)
  canaries = len(included)
  if canaries < 2:
    raise ValueError(f"an audit needs at least 2 canaries, got {canaries}")
  for name, values in scores.items():
    if np.shape(values) != (canaries,) or not np.all(np.isfinite(values)):
      raise ValueError(f"score {name!r} must be {canaries} finite numbers, one per canary")
  pairs = list(pairs) if pairs is not None else k_pairs(canaries)
  per_try = beta / (len(pairs) * len(scores))
  tie_order = np.random.default_rng(tie_seed).permutation(canaries)
  tries = []
  for name, values in scores.items():
    for k_plus, k_minus in pairs:
      correct = correct_guesses(np.asarray(values, float), included, k_plus, k_minus, tie_order)
      tries.append(Guesses(name, k_plus, k_minus, correct, epsilon_lower_bound(
          k_plus + k_minus, correct, canaries, delta, per_try)))
  return OneRunAudit(tuple(tries), beta, delta, canaries)
