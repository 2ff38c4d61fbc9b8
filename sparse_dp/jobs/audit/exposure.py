"""Canary exposure (Carlini et al. 2019, "The Secret Sharer", §4; Li et al., arXiv 2022, §4.3).

The exposure of an inserted secret among ``|R|`` candidates is
``log2 |R| - log2 rank``, the rank being the secret's place when the model
orders the candidates by how well it fits them (rank 1: fits it best). Here
the candidates of an included canary are itself and the *excluded* canaries:
secrets drawn from the same distribution that the model never saw, so they
play the randomness space's role exactly. Ties get the mid rank. Exposure is
at most ``log2 |R|`` (the canary ranks first); a model that has not memorised
the canaries has expected exposure
``log2 |R| - (1/|R|) sum_{r=1}^{|R|} log2 r`` (about ``log2 e ~ 1.44`` bits
for large ``|R|``).
"""

from __future__ import annotations

import math

import numpy as np


def exposures(scores: np.ndarray, included: np.ndarray) -> np.ndarray:
  """The exposure of each included canary among the excluded ones.

  Exposure is defined by Carlini et al. 2019, "The Secret Sharer", §4.
  The exposure of a secret among ``|R|`` candidates is ``log2 |R| - log2 rank``.
  Its rank is its place when the model orders the candidates by how well it fits them (rank 1:
  fits it best).
  The candidates of an included canary are itself and the excluded canaries.
  Ties get the mid rank.

  Args:
    scores (array-like): ``[m]``, each canary's score; a higher score is a better fit.
    included (array-like of bool): ``[m]``, whether each canary was in the training data.

  Returns:
    The exposures of the included canaries, in their order, each at most ``log2 |R|``.
  """
  scores, included = np.asarray(scores, float), np.asarray(included, bool)
  reference = np.sort(scores[~included])
  candidates = len(reference) + 1
  inserted = scores[included]
  above = len(reference) - np.searchsorted(reference, inserted, side="right")
  ties = np.searchsorted(reference, inserted, side="right") - np.searchsorted(
      reference, inserted, side="left")
  ranks = 1 + above + ties / 2
  return math.log2(candidates) - np.log2(ranks)


def chance_exposure(candidates: int) -> float:
  """Expected exposure when the secret's rank is uniform over ``candidates``."""
  return math.log2(candidates) - math.lgamma(candidates + 1) / math.log(2) / candidates


def exposure_summary(scores: np.ndarray, included: np.ndarray) -> dict:
  """Mean, median and largest exposure of the included canaries, with chance and maximum."""
  values = exposures(scores, included)
  candidates = int((~np.asarray(included, bool)).sum()) + 1
  if values.size == 0:
    return {"canaries_ranked": 0, "candidates": candidates}
  return {"canaries_ranked": int(values.size), "candidates": candidates,
          "mean": float(values.mean()), "median": float(np.median(values)),
          "max": float(values.max()), "chance_mean": chance_exposure(candidates),
          "max_possible": math.log2(candidates)}
