"""Configuration of DP training: algorithm, clipping norms, noise, threshold."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Optional, Sequence

from sparse_dp.accounting import Algorithm
from sparse_dp.accounting.algorithms import check_positive
from sparse_dp.mechanisms.selection.row_selection import false_positive_probability


@dataclasses.dataclass(frozen=True)
class DPConfig:
  """What :func:`sparse_dp.make_private` trains with.

  Attributes:
    algorithm: ``none``, ``dpsgd``, ``fest``, ``adafest`` or ``adafest+``.
    l2_norm_clip: ``C2``, the joint per-example gradient norm bound.
    noise_multiplier: ``sigma`` of ``dpsgd`` and ``fest``.
    sigma1: contribution-map noise multiplier of ``adafest`` / ``adafest+``.
    sigma2: gradient noise multiplier of ``adafest`` / ``adafest+``.
    target_epsilon: instead of the noise, calibrate it to this epsilon over
      the planned epochs (``sigma1 / sigma2 = sigma_ratio`` for AdaFEST).
    sigma_ratio: ``sigma1 / sigma2`` when calibrating AdaFEST (paper: 5 or 10).
    contribution_clip: ``C1``, the contribution-vector norm bound.
    threshold_sigmas: the threshold ``tau`` in units of the contribution map's
      noise, ``tau = threshold_sigmas * sigma1 * C1`` (default 4): a row nobody
      touched is then selected with probability ``Psi(threshold_sigmas)``
      (``Psi(4) = 3.2e-5``) whatever noise the calibration picks (§3.2,
      App. B.2). Ignored when ``threshold`` is given.
    threshold: ``tau`` in absolute units (contributions of examples), instead
      of ``threshold_sigmas``.
    selection_epsilon: ``epsilon1`` already spent on a DP top-k preselection
      of the tables' buckets (``fest``, ``adafest+``); charged by the accountant.
    delta: target delta; default ``1 / num_examples``.
    epsilon_budget: training stops before a step that would exceed it
      (default: ``target_epsilon`` when given).
    noise_seed: ``None`` (default): a fresh secret seed from the operating
      system for the noise and the Poisson sampling. An integer makes runs
      reproducible, but the noise is then only as secret as that integer:
      anyone who knows it can regenerate and subtract the noise, so never use
      a fixed seed for a release. Each step uses ``fold_in(seed, step)``.
    microbatch_size: process each (logical) batch in micro-batches of this
      many examples and add the noise once (gradient accumulation): memory
      then depends on the micro-batch, not the batch. ``None``: one pass.
    debug_metrics: also log un-noised statistics of each batch (its training
      loss and compiled metrics, ``rows_dropped``, ``false_positive_rows``,
      ``gradient_snr``). They are functions of the private batch without
      noise, so they are NOT covered by the epsilon; the report says so.
      Default ``False``: the logs hold only what is DP or public.

  Raises:
    ValueError: an unknown ``algorithm``; a clipping norm or threshold that is not a
      finite number > 0; a ``microbatch_size`` that is not an integer >= 1; or a private
      algorithm given neither its noise nor ``target_epsilon``.
  """

  algorithm: str = "adafest"
  l2_norm_clip: float = 1.0
  noise_multiplier: Optional[float] = None
  sigma1: Optional[float] = None
  sigma2: Optional[float] = None
  target_epsilon: Optional[float] = None
  sigma_ratio: float = 5.0
  contribution_clip: float = 1.0
  threshold_sigmas: float = 4.0
  threshold: Optional[float] = None
  selection_epsilon: float = 0.0
  delta: Optional[float] = None
  epsilon_budget: Optional[float] = None
  noise_seed: Optional[int] = None
  microbatch_size: Optional[int] = None
  debug_metrics: bool = False

  def __post_init__(self):
    algorithm = Algorithm.parse(self.algorithm)
    object.__setattr__(self, "algorithm", algorithm.value)
    check_positive("l2_norm_clip (C2)", self.l2_norm_clip)
    check_positive("contribution_clip (C1)", self.contribution_clip)
    check_positive("threshold_sigmas", self.threshold_sigmas)
    if self.threshold is not None:
      check_positive("threshold (tau)", self.threshold)
    if self.microbatch_size is not None and (
        not isinstance(self.microbatch_size, int) or self.microbatch_size < 1):
      raise ValueError(f"microbatch_size must be an integer >= 1, got {self.microbatch_size!r}")
    if algorithm.is_private and self.target_epsilon is None:
      needed = (("sigma1", "sigma2") if algorithm.uses_contribution_map
                else ("noise_multiplier",))
      missing = [n for n in needed if getattr(self, n) is None]
      if missing:
        raise ValueError(f"algorithm '{algorithm.value}' needs {' and '.join(missing)} "
                         "or target_epsilon")

  @property
  def kind(self) -> Algorithm:
    """``algorithm`` as an :class:`~sparse_dp.accounting.Algorithm`."""
    return Algorithm(self.algorithm)

  def threshold_for(self, sigma1: float) -> float:
    """The AdaFEST threshold ``tau`` at contribution-map noise ``sigma1`` (§3.2).

    Args:
      sigma1: the noise multiplier of the contribution map.

    Returns:
      ``threshold`` if given, else ``threshold_sigmas * sigma1 * C1``.
    """
    if self.threshold is not None:
      return self.threshold
    return self.threshold_sigmas * sigma1 * self.contribution_clip


def warn_if_threshold_densifies(vocabulary_sizes: Sequence[int], threshold: float,
                                noise_stddev: float, expected_batch_size: float) -> float:
  """Warns when ``tau`` lets more untouched rows through than a batch touches.

  A row no example touched passes the threshold with probability
  ``p = Psi(tau / (sigma1 C1))`` (App. B.2), so a step updates about
  ``sum_t V_t p`` false-positive rows. A batch touches at most about ``B`` rows
  per table (one id per example; more for multi-valent features); when the
  false positives exceed that, noise dominates the update and its size grows
  with the vocabulary, not the batch. Returns the expected false positives.
  """
  expected = sum(vocabulary_sizes) * false_positive_probability(threshold, noise_stddev)
  touched = expected_batch_size * len(vocabulary_sizes)
  if expected > touched:
    warnings.warn(
        f"sparse-dp: threshold tau = {threshold:.4g} is only {threshold / noise_stddev:.3g} "
        f"times the contribution map's noise (sigma1 C1 = {noise_stddev:.4g}): about "
        f"{expected:,.0f} untouched rows per step pass it, more than the ~{touched:,.0f} rows a "
        "batch touches, so the update is mostly noise and not sparse; raise "
        "DPConfig(threshold_sigmas=...) (default 4) or drop threshold=", stacklevel=3)
  return expected
