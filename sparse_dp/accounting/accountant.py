"""An accountant a training run updates step by step and queries at any time.

Training steps are Poisson-subsampled Gaussian mechanisms and are composed by
``dp_accounting`` (PLD by default, as in Ghazi et al., NeurIPS 2023, App. C.5; RDP on request).
Pure-DP spends such as DP-FEST's top-k selection compose with them by basic
composition (Lemma C.5, App. C.3): ``epsilon = sum(pure) + epsilon_train(delta)``.

Steps on batches truncated to at most ``M`` examples (:class:`Truncation`,
``sparse-dp sample --max-batch-size``) are truncated Poisson-subsampled
Gaussians: ``dp_accounting.TruncatedSubsampledGaussianDpEvent`` (dp-accounting
>= 0.5.1, PLD only); an older dp-accounting refuses them. See docs/epsilon.md ("How the
privacy is accounted").
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import math
from typing import Optional

import dp_accounting
from dp_accounting import pld as dp_pld
from dp_accounting import rdp as dp_rdp

from sparse_dp.accounting.algorithms import check_positive
from sparse_dp.accounting.discretization import COARSE_INTERVAL, DEFAULT_INTERVAL, pld_interval
from sparse_dp.accounting.gaussian_pld import subsampled_gaussian_pld
from sparse_dp.accounting.schedule import BatchSchedule


class AccountantKind(str, enum.Enum):
  """Which ``dp_accounting`` accountant composes the training steps.

  Attributes:
    PLD: privacy loss distributions, the default (Ghazi et al., NeurIPS 2023, App. C.5).
    RDP: Renyi DP, on request; it does not account truncated batches.
  """

  PLD = "pld"
  RDP = "rdp"

  @classmethod
  def parse(cls, name: "str | AccountantKind") -> "AccountantKind":
    """The kind named ``name``.

    Args:
      name: ``"pld"``, ``"rdp"`` or a kind.

    Returns:
      The kind.

    Raises:
      ValueError: ``name`` is neither ``pld`` nor ``rdp``.
    """
    try:
      return cls(name)
    except ValueError:
      raise ValueError(f"unknown accountant {name!r}; choose 'pld' or 'rdp'") from None

  def new(self, coarse: bool = False,
          event: "dp_accounting.DpEvent | None" = None) -> dp_accounting.PrivacyAccountant:
    """A fresh, empty ``dp_accounting`` accountant of this kind.

    Args:
      coarse: PLD only: discretise privacy losses on a 10x coarser grid (1e-3 vs
        dp_accounting's 1e-4). The rounding onto a coarser grid that contains the fine
        one is pessimistic, so its epsilon is an upper bound, found ~10x faster.
      event: PLD only: the event the accountant will compose. The grid is widened
        further where the fine one would not fit in memory (small noise, many steps;
        :func:`pld_interval`); still pessimistic, so still an upper bound.

    Returns:
      A PLD accountant that builds each distinct subsampled Gaussian step once per
        process, or ``dp_accounting``'s RDP accountant.
    """
    if self is AccountantKind.PLD:
      interval = COARSE_INTERVAL if coarse else DEFAULT_INTERVAL
      if event is not None:
        interval = pld_interval(event, interval)
      return StepCachingPLDAccountant(value_discretization_interval=interval)
    return dp_rdp.RdpAccountant()


class StepCachingPLDAccountant(dp_pld.PLDAccountant):
  """``dp_accounting``'s PLD accountant, with the PLD of each distinct Poisson-subsampled
  Gaussian step built once per process, and faster.

  ``dp_accounting`` builds a step's PLD anew for each query (~0.1-2 s at the default
  interval; composing it ``T`` times by FFT, ~0.1 s), and a search over steps or a run's
  repeated epsilon queries compose the same step again and again. Here it is built by
  :func:`~sparse_dp.accounting.gaussian_pld.subsampled_gaussian_pld` (the same connect-the-dots
  grid, ~10x faster), kept (PLDs are immutable: ``compose`` and ``self_compose`` return new
  ones) and composed as ``dp_accounting`` composes it: the same epsilon, bit for bit on
  dp-accounting 0.4.3 but for grid points within ``1e-9`` of the largest loss, where it is
  never smaller (``tests/unit/accounting/test_accounting.py``, ``test_gaussian_pld.py``).
  """

  def _maybe_compose(self, event: dp_accounting.DpEvent, count: int, do_compose: bool):
    if (do_compose and isinstance(event, dp_accounting.PoissonSampledDpEvent)
        and isinstance(event.event, dp_accounting.GaussianDpEvent)
        and event.sampling_probability > 0 and event.event.noise_multiplier > 0
        and self.neighboring_relation == dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE):
      step = _subsampled_gaussian_pld(float(event.event.noise_multiplier),
                                      float(event.sampling_probability),
                                      self._value_discretization_interval)
      self._pld = self._pld.compose(step.self_compose(count))
      return None
    return super()._maybe_compose(event, count, do_compose)


_subsampled_gaussian_pld = functools.lru_cache(maxsize=64)(subsampled_gaussian_pld)


@dataclasses.dataclass(frozen=True)
class Truncation:
  """Batches of a Poisson sample of ``num_examples`` cut to ``max_batch_size`` at most.

  Such steps are truncated Poisson-subsampled Gaussians, accounted by
  ``dp_accounting.TruncatedSubsampledGaussianDpEvent`` (PLD only).

  Attributes:
    num_examples: ``N``, the examples each batch is sampled from.
    max_batch_size: ``M``, the most examples a batch keeps, in ``[1, N]``.

  Raises:
    ValueError: ``max_batch_size`` is not in ``[1, num_examples]``, or the installed
      dp-accounting is older than 0.5.1 and lacks the truncated event.
  """

  num_examples: int
  max_batch_size: int

  def __post_init__(self):
    if not 1 <= self.max_batch_size <= self.num_examples:
      raise ValueError(f"max_batch_size must be in [1, num_examples={self.num_examples}], "
                       f"got {self.max_batch_size}")
    if not hasattr(dp_accounting, "TruncatedSubsampledGaussianDpEvent"):
      raise ValueError(
          f"truncated batches (max batch size {self.max_batch_size}) are accounted by "
          "dp_accounting.TruncatedSubsampledGaussianDpEvent, which needs dp-accounting >= "
          f"0.5.1 (installed: {_dp_accounting_version()}); use the Python 3.12+ stack, or "
          "sample without --max-batch-size")


def _dp_accounting_version() -> str:
  import importlib.metadata
  return importlib.metadata.version("dp-accounting")


def gaussian_steps_event(noise_multiplier: float, sampling_rate: float, steps: int,
                         truncation: Optional[Truncation] = None) -> dp_accounting.DpEvent:
  """``steps`` Poisson-subsampled Gaussian steps (App. C.2), truncated if ``truncation``.

  Args:
    noise_multiplier: ``sigma`` of each step's Gaussian, in units of the sensitivity.
    sampling_rate: ``q``, each example's probability of joining a batch.
    steps: the number of steps.
    truncation: the batches' truncation, or ``None`` for plain Poisson batches.

  Returns:
    A ``dp_accounting.SelfComposedDpEvent`` of ``steps`` such steps.
  """
  if truncation is not None:
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.TruncatedSubsampledGaussianDpEvent(
            truncation.num_examples, sampling_rate, truncation.max_batch_size,
            noise_multiplier), steps)
  return dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
          sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)),
      steps)


@dataclasses.dataclass(frozen=True)
class _GaussianRun:
  noise_multiplier: float
  sampling_rate: float
  steps: int
  truncation: Optional[Truncation] = None


def _training_event(runs: tuple[_GaussianRun, ...]) -> dp_accounting.DpEvent:
  return dp_accounting.ComposedDpEvent([
      gaussian_steps_event(r.noise_multiplier, r.sampling_rate, r.steps, r.truncation)
      for r in runs])


def _grid_event(runs: tuple[_GaussianRun, ...]) -> dp_accounting.DpEvent:
  """What sizes the PLD grid: the runs, a truncated one's losses bounded by the untruncated
  steps' of sensitivity 2 (noise multiplier ``sigma / 2``)."""
  return _training_event(tuple(
      dataclasses.replace(r, noise_multiplier=r.noise_multiplier / 2, truncation=None)
      if r.truncation else r for r in runs))


@functools.lru_cache(maxsize=1024)
def _training_epsilon(kind: AccountantKind, runs: tuple[_GaussianRun, ...],
                      delta: float) -> float:
  """Epsilon at ``delta`` of ``runs``, once per process for each distinct question.

  A run asks the same question many times over (its callback's queries, the budget's
  step search, ``epsilon_after``'s what-ifs), and each answer composes every step anew.
  """
  return float(kind.new(event=_grid_event(runs)).compose(_training_event(runs))
               .get_epsilon(delta))


class PrivacyAccountant:
  """What a run has spent so far, as events; ``get_epsilon`` at any time.

  Training steps are Poisson-subsampled Gaussian mechanisms, composed by
  ``dp_accounting``. Pure-DP spends, such as DP-FEST's top-k selection, add to their
  epsilon by basic composition (Lemma C.5, App. C.3).

  Example:
    ```python
    accountant = PrivacyAccountant("pld")
    accountant.spend_pure(0.01)                       # DP-FEST selection
    accountant.step(noise_multiplier=1.1, sampling_rate=2048 / 45e6, num_steps=100)
    accountant.get_epsilon(delta=1 / 45e6)
    ```

  Args:
    kind: the accountant of the training steps: ``"pld"`` (default) or ``"rdp"``.

  Raises:
    ValueError: ``kind`` is neither ``pld`` nor ``rdp``.
  """

  def __init__(self, kind: "str | AccountantKind" = AccountantKind.PLD):
    self.kind = AccountantKind.parse(kind)
    self._runs: list[_GaussianRun] = []
    self._pure_epsilons: list[float] = []

  def step(self, noise_multiplier: float, sampling_rate: float, num_steps: int = 1,
           truncation: Optional[Truncation] = None) -> "PrivacyAccountant":
    """Records ``num_steps`` steps of one Poisson-subsampled Gaussian each (truncated).

    Args:
      noise_multiplier: ``sigma`` of each step's Gaussian, a finite number > 0.
      sampling_rate: ``q``, in ``(0, 1]``.
      num_steps: the number of steps, an integer >= 0.
      truncation: the batches' truncation, or ``None`` for plain Poisson batches.

    Returns:
      This accountant, for chaining.

    Raises:
      ValueError: a noise multiplier, sampling rate or step count out of range, or a
        truncation on the RDP accountant (PLD only).
    """
    check_positive("noise multiplier", noise_multiplier)
    schedule = BatchSchedule.constant(sampling_rate, num_steps)  # validates q, steps
    if truncation is not None and self.kind is not AccountantKind.PLD:
      raise ValueError("truncated batches are accounted by the PLD accountant only; use 'pld'")
    if num_steps == 0:
      return self
    last = self._runs[-1] if self._runs else None
    if (last is not None and last.noise_multiplier == noise_multiplier
        and last.sampling_rate == sampling_rate and last.truncation == truncation):
      self._runs[-1] = dataclasses.replace(last, steps=last.steps + num_steps)
    else:
      self._runs.append(_GaussianRun(noise_multiplier, schedule.phases[0].sampling_rate,
                                     num_steps, truncation))
    return self

  def step_schedule(self, noise_multiplier: float,
                    schedule: BatchSchedule) -> "PrivacyAccountant":
    """Records every phase of ``schedule`` at one noise multiplier.

    Args:
      noise_multiplier: ``sigma`` of each step's Gaussian.
      schedule: the phases: each a sampling rate and a number of steps.

    Returns:
      This accountant, for chaining.

    Raises:
      ValueError: ``noise_multiplier`` is not a finite number > 0.
    """
    for phase in schedule.phases:
      self.step(noise_multiplier, phase.sampling_rate, phase.steps)
    return self

  def spend_pure(self, epsilon: float) -> "PrivacyAccountant":
    """Records an ``(epsilon, 0)``-DP release, e.g. a DP top-k selection.

    Args:
      epsilon: the release's pure-DP epsilon.

    Returns:
      This accountant, for chaining.

    Raises:
      ValueError: ``epsilon`` is not a finite number > 0.
    """
    check_positive("pure-DP epsilon", epsilon)
    self._pure_epsilons.append(float(epsilon))
    return self

  @property
  def steps(self) -> int:
    """Training steps recorded so far."""
    return sum(r.steps for r in self._runs)

  @property
  def pure_epsilon(self) -> float:
    """The sum of the pure-DP epsilons spent (basic composition)."""
    return math.fsum(self._pure_epsilons)

  def training_event(self) -> dp_accounting.DpEvent:
    """All recorded training steps as one composed ``dp_accounting`` event.

    Returns:
      A ``dp_accounting.ComposedDpEvent`` of the steps, pure spends left out.
    """
    return _training_event(tuple(self._runs))

  def get_training_epsilon(self, delta: float) -> float:
    """Epsilon at ``delta`` of the training steps alone.

    Args:
      delta: the target delta, in ``(0, 1)``.

    Returns:
      The training steps' epsilon (0 without steps), cached per process.

    Raises:
      ValueError: ``delta`` is not in ``(0, 1)``.
    """
    _check_delta(delta)
    if not self._runs:
      return 0.0
    return _training_epsilon(self.kind, tuple(self._runs), float(delta))

  def get_epsilon(self, delta: float) -> float:
    """Total epsilon at ``delta``: pure spends plus the training steps.

    Args:
      delta: the target delta, in ``(0, 1)``.

    Returns:
      ``pure_epsilon + get_training_epsilon(delta)``.

    Raises:
      ValueError: ``delta`` is not in ``(0, 1)``.
    """
    return self.pure_epsilon + self.get_training_epsilon(delta)

  def epsilon_after(self, delta: float, noise_multiplier: float, sampling_rate: float,
                    num_steps: int = 1, truncation: Optional[Truncation] = None) -> float:
    """Epsilon that ``num_steps`` more steps would bring the total to.

    This accountant is left unchanged.

    Args:
      delta: the target delta, in ``(0, 1)``.
      noise_multiplier: ``sigma`` of each further step's Gaussian.
      sampling_rate: ``q`` of the further steps.
      num_steps: the number of further steps.
      truncation: the further batches' truncation, or ``None``.

    Returns:
      The total epsilon after the further steps.

    Raises:
      ValueError: an argument out of range, as in :meth:`step` and :meth:`get_epsilon`.
    """
    return copy.deepcopy(self).step(
        noise_multiplier, sampling_rate, num_steps, truncation).get_epsilon(delta)


def _check_delta(delta: float) -> None:
  if not (isinstance(delta, (int, float)) and 0 < delta < 1):
    raise ValueError(f"delta must be in (0, 1), got {delta!r}")
