"""dp_accounting's own PLD epsilon of composed Gaussian mechanisms, plain or Poisson-subsampled,
to check the package's.

Building one subsampled step's PLD takes seconds (a Python loop over its privacy losses);
composing it is fast. Each such PLD is built once per test session, for every test and step
count that uses it.
"""

import functools

import dp_accounting
from dp_accounting import pld
from dp_accounting.pld import privacy_loss_distribution


def gaussians_epsilon(multiplier: float, count: int, delta: float) -> float:
  """Epsilon at ``delta`` of ``count`` Gaussian mechanisms of noise multiplier ``multiplier``."""
  event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(multiplier), count)
  return pld.PLDAccountant().compose(event).get_epsilon(delta)


DISCRETIZATION = 1e-4  # pld.PLDAccountant's default


def poisson_gaussians_epsilon(sampling_rate: float, steps: int, delta: float,
                              multiplier: float) -> float:
  """Epsilon of Poisson-subsampled Gaussian steps, as ``pld.PLDAccountant`` composes them.

  The same PLDs, composed the same way, as ``pld.PLDAccountant().compose(
  PoissonSampledDpEvent(sampling_rate, GaussianDpEvent(multiplier)), steps)``: the same number.

  Args:
    sampling_rate: each example's probability of joining a step's batch.
    steps: how many steps.
    delta: the delta the epsilon is for.
    multiplier: the Gaussian noise multiplier of each step.

  Returns:
    The epsilon at ``delta``.
  """
  return _composed(sampling_rate, steps, multiplier).get_epsilon_for_delta(delta)


@functools.lru_cache(maxsize=None)
def _composed(sampling_rate, steps, multiplier):
  return privacy_loss_distribution.identity(value_discretization_interval=DISCRETIZATION).compose(
      _one_step(sampling_rate, multiplier).self_compose(steps))


@functools.lru_cache(maxsize=None)
def _one_step(sampling_rate, multiplier):
  return privacy_loss_distribution.from_gaussian_mechanism(
      standard_deviation=multiplier, value_discretization_interval=DISCRETIZATION,
      sampling_prob=sampling_rate)
