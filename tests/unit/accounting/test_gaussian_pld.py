"""A subsampled Gaussian step's PLD, built in one numpy pass, is dp_accounting's."""

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as mechanisms

from sparse_dp.accounting.gaussian_pld import hockey_stick_deltas, subsampled_gaussian_pld

from support.stacks import SAME_PLD_BITS

EPSILONS = np.linspace(-2.0, 40.0, 4201)

# q = 1 - exp(-k 1e-4): grid point k is within ulps of -log(1 - q), where a naive evaluation of
# log(1 + (e^-eps - 1) / q) is NaN (k = 409 on dp-accounting 0.4.3, 144 on 0.6).
EDGE_QS = [-math.expm1(-k * 1e-4) for k in (144, 409)]


def _assert_same(ours: np.ndarray, theirs: np.ndarray) -> None:
  if SAME_PLD_BITS:
    np.testing.assert_array_equal(ours, theirs)
  else:  # dp-accounting 0.6 computes the inverse loss of addition as 1 + (-1/2 - ...)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-13)


@pytest.mark.parametrize("sigma, q, interval", [
    (0.4, 0.0625, 1e-3), (0.9, 1e-4, 1e-4), (1.3, 0.5, 1e-3), (20.0, 0.01, 1e-3),
    (0.1, 1e-7, 1e-3), (2.0, 1.0, 1e-3),  # low noise (wide grid), tiny q, q = 1 (one PMF)
    *[(1.0, q, 1e-4) for q in EDGE_QS]])
def test_the_pld_and_its_compositions_are_dp_accountings(sigma, q, interval):
  """Both PMFs (remove, add) have dp_accounting's every field, so every delta and epsilon its
  own code derives from them, composed or not, is its; 40 steps' epsilons check that.

  dp-accounting 0.6 rounds the add PMF's probabilities differently (``_assert_same``):
  there its deltas are compared instead."""
  ours = subsampled_gaussian_pld(sigma, q, interval)
  theirs = pld_lib.from_gaussian_mechanism(sigma, sampling_prob=q,
                                           value_discretization_interval=interval)
  assert ours._symmetric == theirs._symmetric
  for mine, reference in ((ours._pmf_remove, theirs._pmf_remove),
                          (ours._pmf_add, theirs._pmf_add)):
    assert type(mine) is type(reference) and vars(mine).keys() == vars(reference).keys()
    for field, value in vars(reference).items():
      if SAME_PLD_BITS or not (field == "_probs" and reference is theirs._pmf_add):
        np.testing.assert_array_equal(getattr(mine, field), value)
  if not SAME_PLD_BITS:  # the add PMF's own deltas (the PLD's are the larger of both sides)
    _assert_same(ours._pmf_add.get_delta_for_epsilon(EPSILONS),
                 theirs._pmf_add.get_delta_for_epsilon(EPSILONS))
  mine, reference = ours.self_compose(40), theirs.self_compose(40)
  for delta in (1e-3, 1e-6, 1e-10):
    epsilon, expected = mine.get_epsilon_for_delta(delta), reference.get_epsilon_for_delta(delta)
    assert math.isfinite(epsilon)
    assert epsilon == expected if SAME_PLD_BITS else epsilon == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("q", [0.3, *EDGE_QS])
@pytest.mark.parametrize("adjacency", [mechanisms.AdjacencyType.ADD,
                                       mechanisms.AdjacencyType.REMOVE])
def test_deltas_past_the_largest_and_smallest_loss_are_dp_accountings(adjacency, q):
  """Addition's losses end at -log(1 - q) (delta 0 past it); removal's at log(1 - q) (delta
  1 - e^eps below it); both ends and points a few ulps beside them are in the array, where
  dp_accounting takes x = -+inf and the delta here is never smaller."""
  loss = mechanisms.GaussianPrivacyLoss(0.7, sampling_prob=q, adjacency_type=adjacency)
  ends = np.array([-np.log1p(-q), np.log1p(-q)])
  beside = [ends + k * np.spacing(ends) for k in range(-4, 5)]
  epsilons = np.sort(np.concatenate([np.linspace(-3, 3, 601), *beside]))
  near = np.any(np.abs(epsilons[:, None] - ends) <= 1e-9 * np.abs(ends), axis=1)
  ours, theirs = hockey_stick_deltas(loss, epsilons), loss.get_delta_for_epsilon(epsilons)
  assert np.all((ours >= 0) & (ours <= 1))
  _assert_same(ours[~near], theirs[~near])
  assert np.all(ours[near] >= theirs[near] - (0 if SAME_PLD_BITS else 1e-13))
  if adjacency == mechanisms.AdjacencyType.ADD:
    assert np.all(ours[epsilons >= -np.log1p(-q)] == 0)
  else:
    below = epsilons <= np.log1p(-q)
    np.testing.assert_array_equal(ours[below], -np.expm1(epsilons[below]))


@pytest.mark.parametrize("changed", [dict(sensitivity=2.0),
                                     dict(adjacency_type=mechanisms.AdjacencyType.REMOVE,
                                          sensitivity=0.5)])
def test_another_sensitivity_is_refused(changed):
  loss = mechanisms.GaussianPrivacyLoss(1.0, sampling_prob=0.1, **changed)
  with pytest.raises(ValueError, match="sensitivity 1"):
    hockey_stick_deltas(loss, np.array([1.0]))
