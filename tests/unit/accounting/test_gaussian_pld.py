"""A subsampled Gaussian step's PLD, built in one numpy pass, is dp_accounting's."""

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as mechanisms

from sparse_dp.accounting.gaussian_pld import hockey_stick_deltas, subsampled_gaussian_pld

from support.stacks import SAME_PLD_BITS

EPSILONS = np.linspace(-2.0, 40.0, 4201)


def _assert_same(ours: np.ndarray, theirs: np.ndarray) -> None:
  if SAME_PLD_BITS:
    np.testing.assert_array_equal(ours, theirs)
  else:  # dp-accounting 0.6 computes the inverse loss of addition as 1 + (-1/2 - ...)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("sigma, q, interval", [
    (0.4, 0.0625, 1e-3), (0.9, 1e-4, 1e-4), (1.3, 0.5, 1e-3), (20.0, 0.01, 1e-3),
    (2.0, 1.0, 1e-3)])  # low noise (wide grid), tiny and large q, q = 1 (one PMF)
def test_the_pld_and_its_compositions_are_dp_accountings(sigma, q, interval):
  ours = subsampled_gaussian_pld(sigma, q, interval)
  theirs = pld_lib.from_gaussian_mechanism(sigma, sampling_prob=q,
                                           value_discretization_interval=interval)
  for steps in (1, 40):
    mine, reference = ours.self_compose(steps), theirs.self_compose(steps)
    _assert_same(mine.get_delta_for_epsilon(EPSILONS), reference.get_delta_for_epsilon(EPSILONS))
    for delta in (1e-3, 1e-6, 1e-10):
      assert mine.get_epsilon_for_delta(delta) == pytest.approx(
          reference.get_epsilon_for_delta(delta), rel=0 if SAME_PLD_BITS else 1e-9)


@pytest.mark.parametrize("adjacency", [mechanisms.AdjacencyType.ADD,
                                       mechanisms.AdjacencyType.REMOVE])
def test_deltas_past_the_largest_and_smallest_loss_are_dp_accountings(adjacency):
  """Addition's losses end at -log(1 - q) (delta 0 past it); removal's at log(1 - q) (delta
  1 - e^eps below it); both ends and points right beside them are in the array."""
  q = 0.3
  loss = mechanisms.GaussianPrivacyLoss(0.7, sampling_prob=q, adjacency_type=adjacency)
  ends = np.array([-np.log1p(-q), np.log1p(-q)])
  epsilons = np.sort(np.concatenate([np.linspace(-3, 3, 601), ends,
                                     np.nextafter(ends, np.inf), np.nextafter(ends, -np.inf)]))
  ours = hockey_stick_deltas(loss, epsilons)
  assert np.all((ours >= 0) & (ours <= 1))
  _assert_same(ours, loss.get_delta_for_epsilon(epsilons))
  if adjacency == mechanisms.AdjacencyType.ADD:
    assert np.all(ours[epsilons >= -np.log1p(-q)] == 0)
  else:
    below = epsilons <= np.log1p(-q)
    np.testing.assert_array_equal(ours[below], -np.expm1(epsilons[below]))
