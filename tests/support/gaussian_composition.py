"""The PLD epsilon of composed Gaussian mechanisms, shared by the RONA tests."""

import dp_accounting
from dp_accounting import pld


def gaussians_epsilon(multiplier: float, count: int, delta: float) -> float:
  """Epsilon at ``delta`` of ``count`` Gaussian mechanisms of noise multiplier ``multiplier``."""
  event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(multiplier), count)
  return pld.PLDAccountant().compose(event).get_epsilon(delta)
