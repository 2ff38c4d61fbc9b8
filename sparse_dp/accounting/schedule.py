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
  """``steps`` consecutive steps that each sample examples with rate ``sampling_rate``."""

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
  """The phases of a training run, in order."""

  phases: tuple[BatchPhase, ...]

  def __post_init__(self):
    if not self.phases:
      raise ValueError("a batch schedule needs at least one phase")

  @classmethod
  def constant(cls, sampling_rate: float, steps: int) -> "BatchSchedule":
    return cls((BatchPhase(sampling_rate, steps),))

  @classmethod
  def from_batch_sizes(cls, num_examples: int, batch_sizes: Sequence[int],
                       steps: Sequence[int]) -> "BatchSchedule":
    """Phases of expected batch sizes ``batch_sizes[i]`` for ``steps[i]`` steps."""
    if num_examples <= 0:
      raise ValueError(f"number of examples must be > 0, got {num_examples}")
    if len(batch_sizes) != len(steps):
      raise ValueError("give one step count per batch size")
    return cls(tuple(
        BatchPhase(b / num_examples, s) for b, s in zip(batch_sizes, steps)))

  @property
  def total_steps(self) -> int:
    return sum(p.steps for p in self.phases)

  @property
  def sampling_rates(self) -> tuple[float, ...]:
    return tuple(p.sampling_rate for p in self.phases)


def steps_for_epochs(epochs: float, sampling_rate: float) -> int:
  """Steps that visit each example ``epochs`` times in expectation: ``ceil(E/q)``."""
  if not (math.isfinite(epochs) and epochs > 0):
    raise ValueError(f"epochs must be > 0, got {epochs!r}")
  return math.ceil(epochs / sampling_rate - 1e-9)
