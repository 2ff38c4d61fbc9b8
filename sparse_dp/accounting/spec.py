"""What a private training run will do, and what that costs in privacy."""

from __future__ import annotations

import dataclasses
from typing import Optional

from sparse_dp.accounting.accountant import AccountantKind, PrivacyAccountant
from sparse_dp.accounting.algorithms import Algorithm, check_positive, effective_noise_multiplier
from sparse_dp.accounting.schedule import BatchSchedule


@dataclasses.dataclass(frozen=True)
class PrivacySpec:
  """An algorithm, its noise, and its batch schedule.

  Each algorithm takes its own noise parameters:

  * ``dpsgd``: ``noise_multiplier``.
  * ``fest``: ``noise_multiplier`` and ``selection_epsilon`` (epsilon1).
  * ``adafest``: ``sigma1`` (contribution map) and ``sigma2`` (gradient).
  * ``adafest+``: ``sigma1``, ``sigma2`` and ``selection_epsilon``.

  Attributes:
    algorithm: the algorithm (a name is parsed); not ``none``.
    schedule: the training steps' sampling rates and counts.
    noise_multiplier: ``sigma`` of ``dpsgd`` and ``fest``.
    sigma1: the contribution map's noise multiplier (``adafest``, ``adafest+``).
    sigma2: the gradient's noise multiplier (``adafest``, ``adafest+``).
    selection_epsilon: pure-DP ``epsilon1`` of the top-k preselection (``fest``,
      ``adafest+``); 0 for the others.

  Raises:
    ValueError: algorithm ``none`` or an unknown one, or noise parameters the
      algorithm does not take, lacks or has out of range.
  """

  algorithm: Algorithm
  schedule: BatchSchedule
  noise_multiplier: Optional[float] = None
  sigma1: Optional[float] = None
  sigma2: Optional[float] = None
  selection_epsilon: float = 0.0

  def __post_init__(self):
    algorithm = Algorithm.parse(self.algorithm)
    object.__setattr__(self, "algorithm", algorithm)
    if not algorithm.is_private:
      raise ValueError("algorithm 'none' adds no noise and has no privacy guarantee")
    if algorithm.uses_contribution_map:
      _require(self.sigma1 is not None and self.sigma2 is not None and
               self.noise_multiplier is None, algorithm,
               "takes sigma1 and sigma2 (not a single noise multiplier)")
      check_positive("sigma1", self.sigma1)
      check_positive("sigma2", self.sigma2)
    else:
      _require(self.noise_multiplier is not None and self.sigma1 is None and
               self.sigma2 is None, algorithm,
               "takes a noise multiplier (not sigma1/sigma2)")
      check_positive("noise multiplier", self.noise_multiplier)
    if algorithm.uses_top_k_selection:
      check_positive("top-k selection epsilon (epsilon1)", self.selection_epsilon)
    else:
      _require(self.selection_epsilon == 0.0, algorithm,
               "has no top-k selection, so it takes no selection epsilon")

  @property
  def training_noise_multiplier(self) -> float:
    """Noise multiplier of the one Gaussian each training step amounts to.

    ``noise_multiplier``, or :func:`effective_noise_multiplier` of ``sigma1`` and
    ``sigma2`` (§3.3).
    """
    if self.algorithm.uses_contribution_map:
      return effective_noise_multiplier(self.sigma1, self.sigma2)
    return self.noise_multiplier

  def accountant(self, kind: "str | AccountantKind" = "pld") -> PrivacyAccountant:
    """An accountant holding every spend of this run.

    Args:
      kind: ``"pld"`` (default) or ``"rdp"``.

    Returns:
      This run's :class:`PrivacyAccountant`: the selection's pure spend (``fest``,
        ``adafest+``) and every training step.
    """
    accountant = PrivacyAccountant(kind)
    if self.algorithm.uses_top_k_selection:
      accountant.spend_pure(self.selection_epsilon)
    return accountant.step_schedule(self.training_noise_multiplier, self.schedule)


def _require(condition: bool, algorithm: Algorithm, message: str) -> None:
  if not condition:
    raise ValueError(f"algorithm {algorithm.value!r} {message}")
