"""Batch schedules: the sampling rate and number of steps of each phase.

Each step of DP-SGD or DP-AdaFEST is a Poisson-subsampled Gaussian mechanism
with sampling rate ``q = expected batch size / N`` (Ghazi et al., NeurIPS 2023, App. C.2). An
increasing batch-size schedule (Anil et al., Findings of EMNLP 2022, §3, §5.2.2) is a
sequence of phases with different ``q``; the phases compose as separate events.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence


@dataclasses.dataclass(frozen=True)
class BatchPhase:
  """``steps`` consecutive steps that each sample examples with rate ``sampling_rate``.

  Attributes:
    sampling_rate: ``q = expected batch size / N``, in ``(0, 1]``.
    steps: the number of steps, an integer >= 0.

  Raises:
    ValueError: ``sampling_rate`` is not in ``(0, 1]`` or ``steps`` is not an integer
      >= 0.
  """

  sampling_rate: float
  steps: int

  def __post_init__(self):
    q = self.sampling_rate
    if not (isinstance(q, (int, float)) and math.isfinite(q) and 0 < q <= 1):
      raise ValueError(
          f"sampling rate must be in (0, 1], got {q!r}: the expected batch size "
          "cannot exceed the number of examples")
    if not isinstance(self.steps, int) or isinstance(self.steps, bool) or self.steps < 0:
      raise ValueError(f"steps must be an integer >= 0, got {self.steps!r}")


@dataclasses.dataclass(frozen=True)
class BatchSchedule:
  """The phases of a training run, in order.

  Each phase is a separate Poisson-subsampled Gaussian event (App. C.2). An increasing
  batch-size schedule (Anil et al., Findings of EMNLP 2022, §3) has several.

  Attributes:
    phases: the phases, at least one.

  Raises:
    ValueError: ``phases`` is empty.
  """

  phases: tuple[BatchPhase, ...]

  def __post_init__(self):
    if not self.phases:
      raise ValueError("a batch schedule needs at least one phase")

  @classmethod
  def constant(cls, sampling_rate: float, steps: int) -> "BatchSchedule":
    """One phase of ``steps`` steps at ``sampling_rate``.

    Args:
      sampling_rate: ``q``, in ``(0, 1]``.
      steps: the number of steps, an integer >= 0.

    Returns:
      The schedule.

    Raises:
      ValueError: ``sampling_rate`` or ``steps`` out of range.
    """
    return cls((BatchPhase(sampling_rate, steps),))

  @classmethod
  def from_batch_sizes(cls, num_examples: int, batch_sizes: Sequence[int],
                       steps: Sequence[int]) -> "BatchSchedule":
    """Phases of expected batch sizes ``batch_sizes[i]`` for ``steps[i]`` steps.

    Args:
      num_examples: ``N``; phase ``i`` has ``q = batch_sizes[i] / N``.
      batch_sizes: the expected batch size of each phase.
      steps: the number of steps of each phase.

    Returns:
      The schedule.

    Raises:
      ValueError: ``num_examples <= 0``, one step count per batch size is not given,
        or a phase is out of range.
    """
    if num_examples <= 0:
      raise ValueError(f"number of examples must be > 0, got {num_examples}")
    if len(batch_sizes) != len(steps):
      raise ValueError("give one step count per batch size")
    return cls(tuple(
        BatchPhase(b / num_examples, s) for b, s in zip(batch_sizes, steps)))

  @property
  def total_steps(self) -> int:
    """Steps over all phases."""
    return sum(p.steps for p in self.phases)

  @property
  def sampling_rates(self) -> tuple[float, ...]:
    """Each phase's sampling rate, in order."""
    return tuple(p.sampling_rate for p in self.phases)


def steps_for_epochs(epochs: float, sampling_rate: float) -> int:
  """Steps that visit each example ``epochs`` times in expectation: ``ceil(E/q)``.

  Args:
    epochs: ``E``, the expected visits of each example, a finite number > 0.
    sampling_rate: ``q`` of each step.

  Returns:
    ``ceil(E / q)``, tolerant of rounding (``1e-9``).

  Raises:
    ValueError: ``epochs`` is not a finite number > 0.
  """
  if not (math.isfinite(epochs) and epochs > 0):
    raise ValueError(f"epochs must be > 0, got {epochs!r}")
  return math.ceil(epochs / sampling_rate - 1e-9)
