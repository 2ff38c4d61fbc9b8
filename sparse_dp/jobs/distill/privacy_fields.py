"""The privacy fields every ``sparse-dp distill`` report carries: epsilon, adjacency, caveats.

``caveats`` is a list at the report's top level (every caveat kept, none
overwriting another); an epsilon that is not proved is never printed under the
bare name ``epsilon``: it is ``null`` and the number goes under
``epsilon_not_poisson``, as the training callbacks log it
(:data:`sparse_dp.training.wrappers.callbacks.NOT_POISSON_KEY`).
"""

from __future__ import annotations

import math
from typing import Optional

from sparse_dp.accounting.report import NOT_POISSON

ADD_REMOVE = "add or remove one example"
LABEL_REPLACEMENT = "replace one example's label (its features public)"


def label_replacement(epsilon: float, delta: float) -> tuple[float, float]:
  """``(2 eps, (1 + e^eps) delta)``: changing one label, from add/remove ``(eps, delta)``.

  Changing one example's label is a replacement: datasets ``D`` and ``D'``
  differ in one example, and ``D - {x}`` is an add/remove neighbour of both. For
  every set ``S`` of outcomes, ``P[M(D) in S] <= e^eps P[M(D - {x}) in S] + delta
  <= e^eps (e^eps P[M(D') in S] + delta) + delta``, i.e. ``(2 eps, (1 + e^eps)
  delta)``-DP (group privacy for a group of two; Dwork & Roth, "The Algorithmic
  Foundations of Differential Privacy", Theorem 2.2's argument, without its
  ``k e^((k-1) eps) delta`` slack). No tighter accountant is used:
  dp_accounting's PLD and RDP accountants refuse ``REPLACE_ONE`` for
  ``PoissonSampledDpEvent``.
  """
  return 2.0 * epsilon, (1.0 + math.exp(epsilon)) * delta


def epsilon_fields(epsilon: float, delta: float, proved: bool) -> dict:
  """``epsilon`` and ``delta``, or, when ``proved`` is false, ``epsilon: null`` and
  ``epsilon_not_poisson`` (the number the accountant gives for the steps taken)."""
  if proved:
    return {"epsilon": epsilon, "delta": delta}
  return {"epsilon": None, "epsilon_not_poisson": epsilon, "delta": delta}


def not_poisson(steps: int, whose: str) -> str:
  return f"{NOT_POISSON} ({whose} took {steps} steps on such batches)"


def fixed_noise_seed(seed: Optional[int], noise: str) -> list[str]:
  """The caveat of a fixed ``seed`` for ``noise`` (none for ``None``: a secret OS seed)."""
  if seed is None:
    return []
  return [f"the DP noise ({noise}) was drawn from a fixed seed ({seed}): reproducible, "
          "for experiments; it is only as secret as that number, so the epsilon holds only "
          "against whoever does not know it (never use a fixed seed for a release)"]
