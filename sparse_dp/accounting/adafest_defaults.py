"""DP-AdaFEST's threshold and noise ratio when the user sets neither (docs/adafest_defaults.md).

The threshold ``tau = t sigma1 C1`` (Ghazi et al., NeurIPS 2023, §3.2) and the noise ratio
``r = sigma1 / sigma2`` come from two statements, neither of which depends on epsilon:

1. False positives. A row no example touched passes with probability ``Psi(t)`` (App.
   B.2); ``t`` is the least value with ``Psi(t) sum_t V_t = FALSE_POSITIVE_SHARE B`` (0.01 of
   the expected batch size ``B``), at least ``MIN_THRESHOLD_SIGMAS``: one ``t`` for all the
   selected tables, from their rows together.
2. The row at the threshold. Its noisy gradient's signal-to-noise ratio is
   ``t r (g / C2) sqrt(n / d)``: it depends on ``t r`` alone, and the rule keeps
   ``t r = THRESHOLD_TIMES_RATIO`` (8: ``r = 2`` at ``t = 4``).

See docs/adafest_defaults.md ("The rule") for the derivation and the values it gives.
"""

from __future__ import annotations

from statistics import NormalDist
from typing import NamedTuple, Optional, Sequence

FALSE_POSITIVE_SHARE = 0.01  # false-positive rows a step, as a share of the expected batch
THRESHOLD_TIMES_RATIO = 8.0  # t * sigma1 / sigma2
MIN_THRESHOLD_SIGMAS = 1.0
# The rule's constants, as a record of what a run followed (stream jobs, study caches).
RULE = (FALSE_POSITIVE_SHARE, THRESHOLD_TIMES_RATIO)


class AdaFestSettings(NamedTuple):
  """DP-AdaFEST's threshold in units of the map's noise and its noise ratio."""

  threshold_sigmas: float  # t: tau = t sigma1 C1
  sigma_ratio: float  # r = sigma1 / sigma2


def default_threshold_sigmas(vocabulary_sizes: Sequence[int],
                             expected_batch_size: float) -> float:
  """The least ``t >= 1`` with ``Psi(t) sum_t V_t <= 0.01 B`` false positives a step.

  Args:
    vocabulary_sizes: the rows of each table that DP-AdaFEST selects from (dense
      tables left out).
    expected_batch_size: ``B``, the Poisson sample's expected size.

  Returns:
    ``t = max(1, Psi^-1(0.01 B / sum_t V_t))``; 1 when there are no rows to select from.
  """
  rows = sum(vocabulary_sizes)
  if rows <= 0:
    return MIN_THRESHOLD_SIGMAS
  share = FALSE_POSITIVE_SHARE * expected_batch_size / rows
  return max(MIN_THRESHOLD_SIGMAS, -NormalDist().inv_cdf(min(share, 0.5)))


def adafest_settings(vocabulary_sizes: Sequence[int], expected_batch_size: float,
                     threshold_sigmas: Optional[float] = None,
                     sigma_ratio: Optional[float] = None) -> AdaFestSettings:
  """The given settings, and the rule's for those not given.

  Args:
    vocabulary_sizes: the rows of each table that DP-AdaFEST selects from.
    expected_batch_size: ``B``.
    threshold_sigmas: ``t`` if the user set it, else ``None``: :func:`default_threshold_sigmas`.
    sigma_ratio: ``r`` if the user set it, else ``None``: ``8 / t``.

  Returns:
    The :class:`AdaFestSettings` to train with.
  """
  if threshold_sigmas is None:
    threshold_sigmas = default_threshold_sigmas(vocabulary_sizes, expected_batch_size)
  if sigma_ratio is None:
    sigma_ratio = THRESHOLD_TIMES_RATIO / threshold_sigmas
  return AdaFestSettings(threshold_sigmas, sigma_ratio)
