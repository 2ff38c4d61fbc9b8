"""An accountant a training run updates step by step and queries at any time.

Training steps are Poisson-subsampled Gaussian mechanisms and are composed by
``dp_accounting`` (PLD by default, the core paper's App. C.5; RDP on request).
Pure-DP spends such as DP-FEST's top-k selection compose with them by basic
composition (Lemma C.5, App. C.3): ``epsilon = sum(pure) + epsilon_train(delta)``.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import math

import dp_accounting
from dp_accounting import pld as dp_pld
from dp_accounting import rdp as dp_rdp

from sparse_dp.accounting.algorithms import check_positive
from sparse_dp.accounting.discretization import (COARSE_INTERVAL, DEFAULT_INTERVAL,
                                                 pld_interval)
from sparse_dp.accounting.schedule import BatchSchedule


class AccountantKind(str, enum.Enum):
  PLD = "pld"
  RDP = "rdp"

  @classmethod
  def parse(cls, name: "str | AccountantKind") -> "AccountantKind":
    try:
      return cls(name)
    except ValueError:
      raise ValueError(f"unknown accountant {name!r}; choose 'pld' or 'rdp'") from None

  def new(self, coarse: bool = False,
          event: "dp_accounting.DpEvent | None" = None) -> dp_accounting.PrivacyAccountant:
    """A fresh, empty ``dp_accounting`` accountant of this kind.

    ``coarse`` PLD discretises privacy losses on a 10x coarser grid (1e-3 vs
    dp_accounting's 1e-4): pessimistic rounding onto a coarser grid that
    contains the fine one, so its epsilon is an upper bound, found ~10x faster.
    Given the ``event`` it will compose, the PLD grid is widened further where
    the fine one would not fit in memory (:func:`pld_interval`; small noise,
    many steps); still pessimistic, so still an upper bound.
    """
    if self is AccountantKind.PLD:
      interval = COARSE_INTERVAL if coarse else DEFAULT_INTERVAL
      if event is not None:
        interval = pld_interval(event, interval)
      return dp_pld.PLDAccountant(value_discretization_interval=interval)
    return dp_rdp.RdpAccountant()


def gaussian_steps_event(noise_multiplier: float, sampling_rate: float,
                         steps: int) -> dp_accounting.DpEvent:
  """``steps`` Poisson-subsampled Gaussian steps (App. C.2)."""
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
          sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)),
      steps)


@dataclasses.dataclass
class _GaussianRun:
  noise_multiplier: float
  sampling_rate: float
  steps: int


class PrivacyAccountant:
  """What a run has spent so far, as events; ``get_epsilon`` at any time.

  Example::

      accountant = PrivacyAccountant("pld")
      accountant.spend_pure(0.01)                       # DP-FEST selection
      accountant.step(noise_multiplier=1.1, sampling_rate=2048 / 45e6, num_steps=100)
      accountant.get_epsilon(delta=1 / 45e6)
  """

  def __init__(self, kind: "str | AccountantKind" = AccountantKind.PLD):
    self.kind = AccountantKind.parse(kind)
    self._runs: list[_GaussianRun] = []
    self._pure_epsilons: list[float] = []
    self._cache: dict[float, float] = {}

  def step(self, noise_multiplier: float, sampling_rate: float,
           num_steps: int = 1) -> "PrivacyAccountant":
    """Records ``num_steps`` steps of one Poisson-subsampled Gaussian each."""
    check_positive("noise multiplier", noise_multiplier)
    schedule = BatchSchedule.constant(sampling_rate, num_steps)  # validates q, steps
    if num_steps == 0:
      return self
    last = self._runs[-1] if self._runs else None
    if (last is not None and last.noise_multiplier == noise_multiplier
        and last.sampling_rate == sampling_rate):
      last.steps += num_steps
    else:
      self._runs.append(_GaussianRun(noise_multiplier, schedule.phases[0].sampling_rate,
                                     num_steps))
    self._cache.clear()
    return self

  def step_schedule(self, noise_multiplier: float,
                    schedule: BatchSchedule) -> "PrivacyAccountant":
    """Records every phase of ``schedule`` at one noise multiplier."""
    for phase in schedule.phases:
      self.step(noise_multiplier, phase.sampling_rate, phase.steps)
    return self

  def spend_pure(self, epsilon: float) -> "PrivacyAccountant":
    """Records an ``(epsilon, 0)``-DP release, e.g. a DP top-k selection."""
    check_positive("pure-DP epsilon", epsilon)
    self._pure_epsilons.append(float(epsilon))
    self._cache.clear()
    return self

  @property
  def steps(self) -> int:
    return sum(r.steps for r in self._runs)

  @property
  def pure_epsilon(self) -> float:
    return math.fsum(self._pure_epsilons)

  def training_event(self) -> dp_accounting.DpEvent:
    """All recorded training steps as one composed ``dp_accounting`` event."""
    return dp_accounting.ComposedDpEvent([
        gaussian_steps_event(r.noise_multiplier, r.sampling_rate, r.steps)
        for r in self._runs
    ])

  def get_training_epsilon(self, delta: float) -> float:
    """Epsilon at ``delta`` of the training steps alone."""
    _check_delta(delta)
    if not self._runs:
      return 0.0
    if delta not in self._cache:
      event = self.training_event()
      self._cache[delta] = float(self.kind.new(event=event).compose(event).get_epsilon(delta))
    return self._cache[delta]

  def get_epsilon(self, delta: float) -> float:
    """Total epsilon at ``delta``: pure spends plus the training steps."""
    return self.pure_epsilon + self.get_training_epsilon(delta)

  def epsilon_after(self, delta: float, noise_multiplier: float,
                    sampling_rate: float, num_steps: int = 1) -> float:
    """Epsilon that ``num_steps`` more steps would bring the total to."""
    return copy.deepcopy(self).step(
        noise_multiplier, sampling_rate, num_steps).get_epsilon(delta)


def _check_delta(delta: float) -> None:
  if not (isinstance(delta, (int, float)) and 0 < delta < 1):
    raise ValueError(f"delta must be in (0, 1), got {delta!r}")
