"""RONA's query-sample selection (Wang et al., AAAI 2019, Algorithm 3 and eq. 9).

Choose ``N_q`` public samples whose balls of radius lambda cover every public
sample, lambda as small as possible (the minimax facility-location problem,
eq. 9), by the greedy farthest-point rule of Algorithm 3: start from a random
sample, then repeatedly add the sample farthest from the chosen ones,
``argmax_{x_i not in x_q} min_{x_j in x_q} KL(P_s(x_i) || P_s(x_j))``, the
distance being the KL divergence between the student's output distributions.

For a pCTR student the output distribution is Bernoulli(p), so the distance is
``KL(Bern(p_i) || Bern(p_j))``: the selection covers the range of the student's
predicted click rates (a simplification forced by the single output; RONA's
classifiers have ten). Ties (equal predictions) are broken at random.
"""

from __future__ import annotations

import numpy as np

_EDGE = 1e-7  # probabilities are kept in [_EDGE, 1 - _EDGE] so every KL is finite


def bernoulli_kl(p: np.ndarray, q: float) -> np.ndarray:
  """``KL(Bern(p) || Bern(q))`` for each ``p``."""
  return _KLToOne(p).to(q)


class _KLToOne:
  """``KL(Bern(p_i) || Bern(q))`` for all ``i`` at one ``q``, from precomputed logs."""

  def __init__(self, p: np.ndarray):
    self.p = np.clip(np.asarray(p, np.float64).reshape(-1), _EDGE, 1 - _EDGE)
    self.q = 1 - self.p
    self.negative_entropy = self.p * np.log(self.p) + self.q * np.log(self.q)

  def to(self, q: float) -> np.ndarray:
    q = float(np.clip(q, _EDGE, 1 - _EDGE))
    return self.negative_entropy - self.p * np.log(q) - self.q * np.log1p(-q)


def select_queries(probabilities: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
  """Indices of ``count`` samples chosen by Algorithm 3 from the student's ``probabilities``."""
  probabilities = np.asarray(probabilities, np.float64).reshape(-1)
  if not 1 <= count <= len(probabilities):
    raise ValueError(f"cannot select {count} queries from {len(probabilities)} public samples")
  order = rng.permutation(len(probabilities))  # random ties and first sample
  kl = _KLToOne(probabilities[order])
  chosen = np.empty(count, np.int64)
  chosen[0] = 0
  distance = kl.to(kl.p[0])
  distance[0] = -np.inf
  for n in range(1, count):
    chosen[n] = np.argmax(distance)
    np.minimum(distance, kl.to(kl.p[chosen[n]]), out=distance)
    distance[chosen[n]] = -np.inf  # chosen ones stay -inf through the minimum
  return order[chosen]
