"""Smallest noise that meets a target (epsilon, delta).

Wraps ``dp_accounting.calibrate_dp_mechanism`` (Brent's method on the noise
multiplier, whose result is guaranteed to be within budget) with a bracket
found by doubling, so that unreachable targets fail with a clear message.
"""

from __future__ import annotations

import copy
import math
import sys

import dp_accounting

from sparse_dp.accounting.accountant import AccountantKind, PrivacyAccountant
from sparse_dp.accounting.algorithms import Algorithm, check_positive, split_noise_multiplier
from sparse_dp.accounting.schedule import BatchSchedule
from sparse_dp.accounting.spec import PrivacySpec

# Noise multipliers outside this range are not searched: below it the PLD
# discretisation is meaningless, above it training learns nothing.
MIN_NOISE_MULTIPLIER = 0.05
MAX_NOISE_MULTIPLIER = 1e4
_RELATIVE_TOLERANCE = 1e-4
# How far under the target the exact epsilon of the result may fall.
_EPSILON_SLACK = 0.005


class UnreachableTargetError(ValueError):
  """No noise multiplier in the searched range meets the target.

  The search stays within ``[MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER]`` (0.05 to 1e4).
  Below it the PLD discretisation is meaningless; above it training learns nothing. Use
  fewer steps, a smaller sampling rate or another target epsilon.
  """


def calibrate_noise_multiplier(target_epsilon: float, delta: float,
                               schedule: BatchSchedule,
                               kind: "str | AccountantKind" = "pld") -> float:
  """Smallest noise multiplier whose training epsilon at ``delta`` is <= target.

  A search on the coarse (pessimistic, fast) PLD accountant finds a multiplier that meets
  the target; when the exact accountant puts it more than 0.5% under the target, a search
  on the exact accountant narrows it down (:func:`_least_noise`).

  Args:
    target_epsilon: the epsilon of the training steps.
    delta: the target delta.
    schedule: the steps' sampling rates and counts.
    kind: the accountant: ``"pld"`` (default) or ``"rdp"``.

  Returns:
    The noise multiplier: it meets the target and comes within 0.5% of it.

  Raises:
    UnreachableTargetError: the schedule has no steps, or no multiplier in the searched
      range meets the target.
    ValueError: ``target_epsilon`` is not a finite number > 0, or an unknown ``kind``.
  """
  check_positive("target epsilon", target_epsilon)
  kind = AccountantKind.parse(kind)
  if schedule.total_steps == 0:
    raise UnreachableTargetError("the schedule has no steps: there is nothing to calibrate")
  return _least_noise(
      lambda sigma: PrivacyAccountant(kind).step_schedule(sigma, schedule).training_event(),
      target_epsilon, delta, kind)


def calibrate_after(spent: PrivacyAccountant, target_epsilon: float, delta: float,
                    steps: int, sampling_rate: float = 1.0) -> float:
  """Smallest ``sigma`` of ``steps`` more Gaussian steps on one sample, within the target.

  The new steps read one Poisson sample of rate ``q`` (``q = 1``: every example) and
  each releases a sum of sensitivity 1 plus ``N(0, sigma^2)``. Adaptively composed, ``T``
  such steps are exactly one Gaussian mechanism of noise multiplier ``sigma / sqrt(T)``
  (Dong, Roth & Su, "Gaussian Differential Privacy", JRSS-B 2022, Cor. 3.3), so they
  are accounted as one ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma / sqrt(T)))``
  (:func:`release_noise_multiplier`), composed with ``spent``'s events by
  ``dp_accounting``. Pure spends add. The new steps get no budget of their own: the
  same ``delta`` covers all of it.

  Args:
    spent: what was spent before the new steps.
    target_epsilon: the total epsilon, ``spent``'s included.
    delta: the target delta.
    steps: the number of new steps ``T``, an integer >= 1.
    sampling_rate: ``q`` of the one sample all ``T`` steps read, in ``(0, 1]``.

  Returns:
    The least per-step ``sigma`` that keeps ``spent`` plus the new steps
    ``<= target_epsilon``.

  Raises:
    UnreachableTargetError: ``spent`` already uses the target, or no ``sigma`` in the
      searched range meets it.
    ValueError: ``target_epsilon`` is not a finite number > 0, ``steps < 1`` or
      ``sampling_rate`` is outside ``(0, 1]``.
  """
  check_positive("target epsilon", target_epsilon)
  if steps < 1:
    raise ValueError(f"steps must be >= 1, got {steps}")
  BatchSchedule.constant(sampling_rate, 1)  # validates q
  remaining = target_epsilon - spent.pure_epsilon
  if remaining <= 0 or spent.get_training_epsilon(delta) >= remaining:
    raise UnreachableTargetError(
        f"epsilon {spent.get_epsilon(delta):g} is already spent of the target "
        f"{target_epsilon:g}: nothing is left for {steps} more steps")

  def event(release: float):
    return copy.deepcopy(spent).step(release, sampling_rate, 1).training_event()

  # Searched as the release's one Gaussian, whose noise multiplier the search's range bounds;
  # rounded up a few ulps, so that sigma / sqrt(T) is never below the one searched.
  release = _least_noise(event, remaining, delta, spent.kind)
  return release * math.sqrt(steps) * (1 + 4 * sys.float_info.epsilon)


def release_noise_multiplier(noise_multiplier: float, steps: int) -> float:
  """``sigma / sqrt(T)``: the one Gaussian that ``T`` steps of ``sigma`` on one sample are.

  Args:
    noise_multiplier: ``sigma`` of each step.
    steps: ``T``, an integer >= 1.

  Returns:
    The noise multiplier of the single equivalent Gaussian mechanism.
  """
  return noise_multiplier / math.sqrt(steps)


def _least_noise(event, target_epsilon: float, delta: float, kind: AccountantKind) -> float:
  """Smallest ``sigma`` with ``epsilon(event(sigma), delta) <= target_epsilon``.

  A search on the coarse (pessimistic, fast) accountant finds a multiplier that
  meets the target. If the exact accountant puts it more than 0.5% under the
  target, a search on the exact accountant narrows it down from there. Either
  way the result meets the target exactly and comes within 0.5% of it.
  """

  def epsilon(sigma: float, coarse: bool) -> float:
    return kind.new(coarse, event(sigma)).compose(event(sigma)).get_epsilon(delta)

  def solve(start: float, factor: float, coarse: bool) -> float:
    low, high = _bracket(lambda sigma: epsilon(sigma, coarse), target_epsilon, delta,
                         start, factor)
    # The least noise of the bracket needs the widest PLD grid; it fits them all.
    return dp_accounting.calibrate_dp_mechanism(
        make_fresh_accountant=lambda: kind.new(coarse, event(low)), make_event_from_param=event,
        target_epsilon=target_epsilon, target_delta=delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(low, high),
        tol=_RELATIVE_TOLERANCE * low)

  sigma = solve(1.0, 2.0, coarse=True)
  if kind is AccountantKind.RDP or epsilon(sigma, False) >= (1 - _EPSILON_SLACK) * target_epsilon:
    return sigma
  return solve(sigma, 1.02, coarse=False)


def _bracket(epsilon, target: float, delta: float, start: float,
             factor: float) -> tuple[float, float]:
  """``(low, high)`` with ``epsilon(low) > target >= epsilon(high)``, stepping by ``factor``.

  Never evaluates ``epsilon`` outside ``[MIN_NOISE_MULTIPLIER,
  MAX_NOISE_MULTIPLIER]``: below it the PLD loses its numerical footing.
  """
  low = high = start
  if epsilon(start) > target:
    while True:
      if high * factor > MAX_NOISE_MULTIPLIER:
        raise UnreachableTargetError(
            f"epsilon {target:g} at delta {delta:g} needs a noise multiplier above "
            f"{high:g} (the search stops at {MAX_NOISE_MULTIPLIER:g}): use fewer steps, "
            "a smaller sampling rate or a larger target epsilon")
      low, high = high, high * factor
      if epsilon(high) <= target:
        break
  else:
    while True:
      if low / factor < MIN_NOISE_MULTIPLIER:
        raise UnreachableTargetError(
            f"epsilon {target:g} at delta {delta:g} is met even with a noise "
            f"multiplier of {low:g} (the search stops at {MIN_NOISE_MULTIPLIER:g}); "
            "such a target protects nothing: choose a smaller target epsilon")
      low, high = low / factor, low
      if epsilon(low) > target:
        break
  return low, high


def calibrate(algorithm: "str | Algorithm", target_epsilon: float, delta: float,
              schedule: BatchSchedule, kind: "str | AccountantKind" = "pld", *,
              sigma_ratio: float = 5.0, selection_epsilon: float = 0.0) -> PrivacySpec:
  """The spec of ``algorithm`` with the least noise meeting ``target_epsilon``.

  DP-FEST and DP-AdaFEST+ first deduct ``selection_epsilon`` from the target (basic
  composition, App. C.3). DP-AdaFEST and DP-AdaFEST+ split the calibrated noise
  multiplier into ``sigma1`` and ``sigma2`` (:func:`split_noise_multiplier`).

  Args:
    algorithm: the algorithm, by name or as an :class:`Algorithm`.
    target_epsilon: the total epsilon, the selection's included.
    delta: the target delta.
    schedule: the training steps' sampling rates and counts.
    kind: the accountant: ``"pld"`` (default) or ``"rdp"``.
    sigma_ratio: ``sigma1 / sigma2`` for DP-AdaFEST and DP-AdaFEST+.
    selection_epsilon: ``epsilon1`` of the top-k preselection (DP-FEST, DP-AdaFEST+).

  Returns:
    The algorithm's :class:`PrivacySpec`, with the calibrated noise.

  Raises:
    UnreachableTargetError: the selection leaves nothing of the target, or no noise in
      the searched range meets it.
    ValueError: an unknown algorithm or accountant, or ``none``; a target that is not a
      finite number > 0; or a ``selection_epsilon`` that is not > 0 for DP-FEST and
      DP-AdaFEST+, or not 0 for the others.
  """
  algorithm = Algorithm.parse(algorithm)
  check_positive("target epsilon", target_epsilon)
  training_target = target_epsilon
  if algorithm.uses_top_k_selection:
    check_positive("top-k selection epsilon (epsilon1)", selection_epsilon)
    training_target = target_epsilon - selection_epsilon
    if training_target <= 0:
      raise UnreachableTargetError(
          f"target epsilon {target_epsilon:g} leaves nothing for training after "
          f"the top-k selection's epsilon1 = {selection_epsilon:g}; lower epsilon1 "
          "or raise the target")
  sigma = calibrate_noise_multiplier(training_target, delta, schedule, kind)
  noise = {"noise_multiplier": sigma}
  if algorithm.uses_contribution_map:
    noise = dict(zip(("sigma1", "sigma2"), split_noise_multiplier(sigma, sigma_ratio)))
  return PrivacySpec(algorithm=algorithm, schedule=schedule,
                     selection_epsilon=selection_epsilon, **noise)
