"""Deliberately broken mechanisms, for testing the audit only.

Inside :func:`noise_scaled_for_testing`, every ``make_private`` builds its DP
step with the Gaussian noise multipliers (the gradient noise, and DP-AdaFEST's
contribution-map noise) multiplied by ``scale`` in ``[0, 1)``, while the
accountant keeps the calibrated noise it was configured with: the run
*claims* the configured epsilon and has less noise (none at ``scale = 0``).
These are the audit's negative controls, graded: a correct audit with enough
power must find a lower bound above the claim. Nothing else in sparse-dp can
change the noise: ``sparse-dp train`` and ``stream`` have no such flag, and
``sparse-dp audit`` reaches this only through ``--broken-mechanism-for-testing``,
whose results are marked ``"private_run": false`` and whose models are never
saved. The switch is undone on exit, on error too.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Iterator

from sparse_dp.training.dp_step.step import StepNoise
from sparse_dp.training.wrappers import entry_point


@contextlib.contextmanager
def noise_scaled_for_testing(scale: float) -> Iterator[None]:
  """``make_private`` calls inside add ``scale`` x the noise but account for all of it."""
  if not 0 <= scale < 1:
    raise ValueError(f"a broken mechanism's noise scale must be in [0, 1), got {scale}")
  if entry_point.StepNoise is not StepNoise:
    raise RuntimeError("noise_scaled_for_testing is already active")

  def scaled(**fields) -> StepNoise:
    noise = StepNoise(**fields)
    return dataclasses.replace(
        noise, gradient_multiplier=noise.gradient_multiplier * scale,
        contribution_multiplier=(None if noise.contribution_multiplier is None
                                 else noise.contribution_multiplier * scale))

  entry_point.StepNoise = scaled
  try:
    yield
  finally:
    entry_point.StepNoise = StepNoise
