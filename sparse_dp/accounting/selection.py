"""The pure-DP cost of DP-FEST's one-shot top-k bucket selection.

Algorithm 2 of Ghazi et al. (NeurIPS 2023, App. B.1, after Durfee & Rogers 2019) adds
Gumbel noise of scale ``b`` to the bucket counts of a feature and keeps the
``k`` largest. One-shot Gumbel top-k has the distribution of ``k`` peeling
exponential-mechanism picks. Adding one example raises each count by at most 1
and lowers none (counts are of distinct examples, so an example that activates
several buckets of one feature still moves each count by at most 1, in one
direction), so each pick is the monotone exponential mechanism with
``epsilon = 1/b`` and the top-k costs ``k/b`` by basic composition. The paper's
``Gumbel(1/epsilon)`` for a whole top-k undercounts by a factor of ``k``
(docs/epsilon.md, "How the privacy is accounted"); here ``b = k / epsilon_f``.

Features are selected on the same examples, so their costs add up too.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from sparse_dp.accounting.algorithms import check_positive


@dataclasses.dataclass(frozen=True)
class TopKSelectionCost:
  """Per-feature ``k`` and pure-DP ``epsilon`` of one top-k preselection.

  DP-FEST's one-shot Gumbel top-k (Algorithm 2, App. B.1) of ``k`` buckets at scale
  ``b`` costs ``k / b``. The features are selected on the same examples, so their costs
  add up (basic composition).

  Attributes:
    ks: each feature's ``k``, an integer >= 1.
    epsilons: each feature's pure-DP epsilon, a finite number > 0.

  Raises:
    ValueError: no feature, not one ``k`` per epsilon, or a ``k`` or epsilon out of
      range.
  """

  ks: tuple[int, ...]
  epsilons: tuple[float, ...]

  def __post_init__(self):
    if len(self.ks) != len(self.epsilons) or not self.ks:
      raise ValueError("give one k and one epsilon per feature, at least one feature")
    for k in self.ks:
      if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1 for every feature, got {k!r}")
    for eps in self.epsilons:
      check_positive("top-k selection epsilon of a feature", eps)

  @classmethod
  def split_evenly(cls, epsilon: float, ks: Sequence[int]) -> "TopKSelectionCost":
    """Splits a total ``epsilon`` equally over the features (App. B.1).

    Args:
      epsilon: ``epsilon1``, the whole selection's pure-DP epsilon.
      ks: each feature's ``k``.

    Returns:
      The cost with ``epsilon / len(ks)`` per feature.

    Raises:
      ValueError: ``epsilon`` is not a finite number > 0, or a ``k`` is out of range.
    """
    check_positive("top-k selection epsilon (epsilon1)", epsilon)
    return cls(tuple(int(k) for k in ks), tuple(epsilon / len(ks) for _ in ks))

  def gumbel_scale(self, feature: int) -> float:
    """Gumbel scale ``b = k / epsilon`` that makes feature ``feature`` cost its epsilon.

    Args:
      feature: the feature's index.

    Returns:
      ``b = k / epsilon`` of that feature.
    """
    return self.ks[feature] / self.epsilons[feature]

  @property
  def epsilon(self) -> float:
    """Total pure-DP cost over all features (basic composition)."""
    return float(sum(self.epsilons))
