"""Next-item accuracy and canary exposure (Carlini et al. 2019; Li et al. 2022, §4.3, Eq. 12).

Exposure of a canary with secret ``s`` among the candidate set ``R`` (here every
item, ``|R| = num_items``)::

    exposure = log2 |R| - log2 rank(s)

where ``rank(s)`` is 1 + the number of candidates the model gives a strictly
higher probability than ``s`` after the canary's history (ties count in the
secret's favour, the attacker's best case). A secret ranked first has the
maximal exposure ``log2 |R|`` (the paper's teachers: 19.93 = log2 of about 10**6
candidates); a secret ranked uniformly at random has expected exposure about
``1 / ln 2 = 1.44`` bits.
"""

from __future__ import annotations

import numpy as np


def ranks_of(probabilities: np.ndarray, targets: np.ndarray) -> np.ndarray:
  """Rank (1 = most probable) of ``targets[j]`` in row ``j`` of ``probabilities [M, V]``."""
  probabilities = np.asarray(probabilities)
  targets = np.asarray(targets, np.int64)
  if probabilities.ndim != 2 or targets.shape != (probabilities.shape[0],):
    raise ValueError(f"need probabilities [M, V] and targets [M], got {probabilities.shape} "
                     f"and {targets.shape}")
  if len(targets) and (targets.min() < 0 or targets.max() >= probabilities.shape[1]):
    raise ValueError(f"targets must be item ids in [0, {probabilities.shape[1]})")
  target_probability = probabilities[np.arange(len(targets)), targets]
  return 1 + np.sum(probabilities > target_probability[:, None], axis=1)


def exposure(ranks: np.ndarray, num_candidates: int) -> np.ndarray:
  """``log2(num_candidates) - log2(rank)`` (Eq. 12), in bits."""
  ranks = np.asarray(ranks, np.float64)
  if np.any(ranks < 1) or np.any(ranks > num_candidates):
    raise ValueError(f"ranks must be in [1, {num_candidates}]")
  return np.log2(num_candidates) - np.log2(ranks)


def top_k_accuracy(probabilities: np.ndarray, labels: np.ndarray, k: int) -> float:
  """Fraction of examples whose next item is among the ``k`` most probable (ties: optimistic)."""
  return float(np.mean(ranks_of(probabilities, labels) <= k))


def canary_exposures(probabilities: np.ndarray, secrets: np.ndarray) -> tuple:
  """Each canary's secret rank and exposure among all ``V`` items (``probabilities [M, V]``)."""
  ranks = ranks_of(probabilities, secrets)
  return ranks, exposure(ranks, probabilities.shape[1])


def exposure_summary(ranks: np.ndarray, bits: np.ndarray, clued: np.ndarray) -> dict:
  """Mean, median and max exposure and median rank of the canaries, also per clue group."""
  if not len(ranks):
    raise ValueError("exposure needs at least one canary")

  def stats(mask):
    if not mask.any():
      return None
    return {"canaries": int(mask.sum()), "mean_exposure": float(bits[mask].mean()),
            "median_exposure": float(np.median(bits[mask])),
            "max_exposure": float(bits[mask].max()),
            "median_rank": float(np.median(ranks[mask]))}

  clued = np.asarray(clued, bool)
  return {**stats(np.ones_like(clued)), "clued": stats(clued), "unclued": stats(~clued)}


def paired_difference(bits: np.ndarray, reference_bits: np.ndarray) -> dict:
  """Mean per-canary ``bits - reference_bits`` and its standard error (Table 1's delta)."""
  difference = np.asarray(bits) - np.asarray(reference_bits)
  error = difference.std(ddof=1) / np.sqrt(len(difference)) if len(difference) > 1 else None
  return {"mean": float(difference.mean()),
          "standard_error": None if error is None else float(error)}
