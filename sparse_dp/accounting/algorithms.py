"""The training algorithms sparse-dp offers and the noise each one adds.

DP-SGD (Abadi et al.) adds Gaussian noise of std ``sigma * C`` to every gradient
coordinate. DP-FEST (Ghazi et al., NeurIPS 2023, §3.1) first keeps the top-k buckets of each
feature (pure DP, ``epsilon1``), then runs DP-SGD on them. DP-AdaFEST (§3.2,
Algorithm 1) adds two Gaussian mechanisms per step: noise ``sigma1 * C1`` on the
contribution map and ``sigma2 * C2`` on the selected gradient rows. DP-AdaFEST+
(§4.2) is DP-FEST's preselection followed by DP-AdaFEST.
"""

from __future__ import annotations

import enum
import math


class Algorithm(str, enum.Enum):
  """A training algorithm, by the name used on the command line.

  Attributes:
    NONE: plain Keras training, without DP.
    DPSGD: DP-SGD (Abadi et al.): Gaussian noise ``sigma * C`` on every gradient
      coordinate.
    FEST: DP-FEST (§3.1): a pure-DP top-k bucket preselection (``epsilon1``), then
      DP-SGD on the buckets kept.
    ADAFEST: DP-AdaFEST (§3.2, Algorithm 1): noise ``sigma1 * C1`` on the contribution
      map and ``sigma2 * C2`` on the selected gradient rows.
    ADAFEST_PLUS: DP-AdaFEST+ (§4.2): DP-FEST's preselection, then DP-AdaFEST.
  """

  NONE = "none"
  DPSGD = "dpsgd"
  FEST = "fest"
  ADAFEST = "adafest"
  ADAFEST_PLUS = "adafest+"

  @property
  def is_private(self) -> bool:
    """Whether the algorithm adds noise (every one but ``none``)."""
    return self is not Algorithm.NONE

  @property
  def uses_top_k_selection(self) -> bool:
    """Whether the algorithm pays for a DP top-k bucket preselection."""
    return self in (Algorithm.FEST, Algorithm.ADAFEST_PLUS)

  @property
  def uses_contribution_map(self) -> bool:
    """Whether each step adds the noisy contribution map of Algorithm 1."""
    return self in (Algorithm.ADAFEST, Algorithm.ADAFEST_PLUS)

  @property
  def noises_every_row(self) -> bool:
    """Whether each step adds noise to every row of every table (DP-SGD, and DP-FEST on
    its preselected buckets)."""
    return self.is_private and not self.uses_contribution_map

  @classmethod
  def parse(cls, name: str) -> "Algorithm":
    """The algorithm named ``name``.

    Args:
      name: ``none``, ``dpsgd``, ``fest``, ``adafest`` or ``adafest+``.

    Returns:
      The algorithm.

    Raises:
      ValueError: ``name`` is none of these.
    """
    try:
      return cls(name)
    except ValueError:
      choices = ", ".join(a.value for a in cls)
      raise ValueError(
          f"unknown algorithm {name!r}; choose one of: {choices}") from None


def effective_noise_multiplier(sigma1: float, sigma2: float) -> float:
  """Noise multiplier of one Gaussian equivalent to DP-AdaFEST's two.

  Composing Gaussian mechanisms with noise multipliers ``sigma1`` and ``sigma2`` is
  exactly one Gaussian mechanism (Dong, Roth, Su, Cor. 3.3; Ghazi et al., NeurIPS 2023,
  §3.3). App. C.4 of the latter prints the exponent as -2, a typo.

  Args:
    sigma1: the contribution map's noise multiplier.
    sigma2: the gradient's noise multiplier.

  Returns:
    ``sigma = (sigma1**-2 + sigma2**-2) ** -1/2``.

  Raises:
    ValueError: ``sigma1`` or ``sigma2`` is not a finite number > 0.
  """
  check_positive("sigma1", sigma1)
  check_positive("sigma2", sigma2)
  return (sigma1 ** -2 + sigma2 ** -2) ** -0.5


def split_noise_multiplier(sigma: float, ratio: float) -> tuple[float, float]:
  """Inverse of :func:`effective_noise_multiplier` at ``ratio = sigma1/sigma2``.

  From ``sigma**-2 = sigma2**-2 * (ratio**-2 + 1)``.

  Args:
    sigma: the noise multiplier of the one equivalent Gaussian.
    ratio: ``sigma1 / sigma2`` (the paper uses 5 or 10).

  Returns:
    ``(sigma1, sigma2)``, with ``sigma2 = sigma * sqrt(1 + ratio**-2)`` and
      ``sigma1 = ratio * sigma2``.

  Raises:
    ValueError: ``sigma`` or ``ratio`` is not a finite number > 0.
  """
  check_positive("sigma", sigma)
  check_positive("sigma ratio (sigma1/sigma2)", ratio)
  sigma2 = sigma * math.sqrt(1.0 + ratio ** -2)
  return ratio * sigma2, sigma2


def check_positive(name: str, value: float) -> None:
  """Raises ValueError unless ``value`` is a finite number > 0."""
  if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
    raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
