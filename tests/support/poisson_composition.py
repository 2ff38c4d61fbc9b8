"""dp_accounting's own PLD epsilon of Poisson-subsampled Gaussian steps, to check the package's.

Building one step's PLD takes seconds (a Python loop over its privacy losses); composing it is
fast. Each step's PLD is built once per test session, for every test and step count that uses
it.
"""

import functools

from dp_accounting.pld import privacy_loss_distribution

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
