"""What RONA's answers cost: a composition of Gaussian mechanisms, one per answered batch.

A batch answer is ``S`` per-example answers, each clipped to norm ``C``, plus
``N(0, (sigma C)^2)`` per coordinate. The teacher is not private: one private example may
change every answer of the batch by up to ``2C``, so the L2 sensitivity is ``2 C sqrt(S)``
and the answer is a Gaussian mechanism of noise multiplier ``sigma / (2 sqrt(S))``, whatever
``C``. The queries are public, so there is no amplification by sampling: ``T`` answers compose
as ``T`` Gaussian mechanisms (dp_accounting's PLD accountant). RONA (Wang et al., AAAI 2019)
takes the clip bound ``C sqrt(S)`` as the sensitivity instead, twice the true multiplier;
:func:`rona_claimed_epsilon` computes that claim for comparison, not as a guarantee. See
docs/commands/distill.md.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Sequence

import dp_accounting
from dp_accounting import pld as dp_pld

from sparse_dp.accounting import BatchSchedule
from sparse_dp.accounting.noise_calibration import calibrate_noise_multiplier


def answer_noise_multiplier(sigma: float, batch_size: int) -> float:
  """Noise std over the L2 sensitivity ``2 C sqrt(S)`` of one batch answer."""
  return sigma / (2.0 * math.sqrt(batch_size))


def _epsilon(multipliers: Sequence[float], delta: float) -> float:
  if not multipliers:
    return 0.0
  counts = collections.Counter(multipliers)
  event = dp_accounting.ComposedDpEvent([
      dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(z), n)
      for z, n in counts.items()])
  return dp_pld.PLDAccountant().compose(event).get_epsilon(delta)


def rona_epsilon(sigma: float, batch_sizes: Sequence[int], delta: float) -> float:
  """Epsilon at ``delta`` of the batches answered (their sizes), one Gaussian mechanism each."""
  return _epsilon([answer_noise_multiplier(sigma, s) for s in batch_sizes], delta)


def rona_claimed_epsilon(sigma: float, batch_sizes: Sequence[int], delta: float) -> float:
  """The epsilon RONA's argument would claim (sensitivity = the clip bound ``C sqrt(S)``)."""
  return _epsilon([sigma / math.sqrt(s) for s in batch_sizes], delta)


def calibrate_sigma(target_epsilon: float, delta: float, batch_size: int,
                    num_batches: int) -> float:
  """Smallest sigma with which ``num_batches`` answers of ``batch_size`` meet the target."""
  multiplier = calibrate_noise_multiplier(target_epsilon, delta,
                                          BatchSchedule.constant(1.0, num_batches))
  return 2.0 * math.sqrt(batch_size) * multiplier


@dataclasses.dataclass(frozen=True)
class RonaSchedule:
  """How many batches Algorithm 1 asks the teacher: ``(T_h + R T_d) N_q / S``."""

  batch_size: int  # S
  queries_per_epoch: int  # N_q, a multiple of S
  hint_epochs: int
  rounds: int
  distill_epochs: int

  @classmethod
  def from_args(cls, args, num_public: int) -> "RonaSchedule":
    for name in ("hint_epochs", "rounds", "distill_epochs", "self_epochs"):
      if getattr(args, name) < 0:
        raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if args.query_batch_size < 1:
      raise ValueError(f"--query-batch-size must be >= 1, got {args.query_batch_size}")
    if not 0 < args.query_share <= 1:
      raise ValueError(f"--query-share must be in (0, 1], got {args.query_share}")
    batches = int(args.query_share * num_public) // args.query_batch_size
    if batches < 1:
      raise ValueError(
          f"--query-share {args.query_share} of {num_public} public examples is less than one "
          f"batch of --query-batch-size {args.query_batch_size}: raise the share or the public "
          "examples, or lower the batch size")
    return cls(args.query_batch_size, batches * args.query_batch_size, args.hint_epochs,
               args.rounds, args.distill_epochs)

  @property
  def batches_per_epoch(self) -> int:
    return self.queries_per_epoch // self.batch_size

  @property
  def hint_batches(self) -> int:
    return self.hint_epochs * self.batches_per_epoch

  @property
  def answered_batches(self) -> int:
    return (self.hint_epochs + self.rounds * self.distill_epochs) * self.batches_per_epoch
