"""The PLD of one Poisson-subsampled Gaussian step, its grid computed in one numpy pass.

``dp_accounting`` builds it by connect-the-dots (Doroshenko, Ghazi, Kamath, Kumar and
Manurangsi, "Connect the Dots: Tighter Discrete Approximations of Privacy Loss
Distributions", PETS 2022): the hockey-stick divergence ``delta(eps)`` at every grid point
``eps = i * Delta`` between the loss's tail bounds, then a pessimistic PMF from them. Each
point needs the inverse privacy loss ``x(eps)``, which dp-accounting 0.4-0.6 finds in a
Python loop: ~1 s a step at ``Delta = 1e-4``. Here the points are computed at once, and
``dp_accounting``'s own bounds, CDFs and PMF constructor do the rest, ~10x faster: the same
distribution to within float rounding (``tests/unit/accounting/test_gaussian_pld.py``), never
a smaller ``delta`` (:func:`hockey_stick_deltas`).
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld import privacy_loss_mechanism as mechanisms

_ADD, _REMOVE = mechanisms.AdjacencyType.ADD, mechanisms.AdjacencyType.REMOVE


def subsampled_gaussian_pld(noise_multiplier: float, sampling_rate: float,
                            interval: float) -> pld_lib.PrivacyLossDistribution:
  """The pessimistic PLD of ``N(0, sigma^2)`` added to a sum of sensitivity 1 over a Poisson
  sample of rate ``q``, under add-or-remove-one adjacency.

  What ``dp_accounting``'s ``from_gaussian_mechanism(sigma, sampling_prob=q,
  value_discretization_interval=interval)`` returns, built faster.

  Args:
    noise_multiplier: ``sigma``, > 0.
    sampling_rate: ``q``, in ``(0, 1]``.
    interval: ``Delta``, the grid's spacing of privacy losses.

  Returns:
    The step's privacy loss distribution (one PMF when ``q = 1``, else remove and add).
  """
  remove = _connect_the_dots(noise_multiplier, sampling_rate, interval, _REMOVE)
  if sampling_rate == 1.0:
    return pld_lib.PrivacyLossDistribution(remove)
  return pld_lib.PrivacyLossDistribution(
      remove, _connect_the_dots(noise_multiplier, sampling_rate, interval, _ADD))


def _connect_the_dots(sigma: float, q: float, interval: float,
                      adjacency: mechanisms.AdjacencyType) -> pld_pmf.PLDPmf:
  loss = mechanisms.GaussianPrivacyLoss(sigma, sampling_prob=q, adjacency_type=adjacency)
  bounds = loss.connect_dots_bounds()
  lower = math.floor(bounds.epsilon_lower / interval)
  upper = math.ceil(bounds.epsilon_upper / interval)
  epsilons = np.arange(lower, upper + 1) * interval
  return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(
      interval, lower, upper, hockey_stick_deltas(loss, epsilons))


def hockey_stick_deltas(loss: mechanisms.GaussianPrivacyLoss,
                        epsilons: np.ndarray) -> np.ndarray:
  """``delta(eps) = mu_upper(X <= x(eps)) - e^eps mu_lower(X <= x(eps))`` at each ``eps``.

  ``x(eps)`` is the largest ``x`` whose privacy loss is at least ``eps`` (the loss falls
  as ``x`` grows). With ``L(s) = log(1 + (e^s - 1) / q)``: ``x = -1/2 - sigma^2 L(eps)``
  for removal, ``x = 1/2 + sigma^2 L(-eps)`` for addition (sensitivity 1). Past the
  largest loss of addition, ``-log(1 - q)``, ``delta`` is 0; below the smallest of removal,
  ``log(1 - q)``, it is ``1 - e^eps``.

  ``dp_accounting``'s ``loss.get_delta_for_epsilon(epsilons)``, to the bit on 0.4.3 except
  within ``1e-9`` (relative) of ``-+log(1 - q)``, where it takes ``x = -+inf`` and this
  evaluates ``x``: a ``delta`` never smaller there.

  Args:
    loss: a Gaussian privacy loss of sensitivity 1, adjacency add or remove.
    epsilons: the ``eps`` values, float64.

  Returns:
    ``delta`` at each ``eps``, clipped to ``[0, 1]``.

  Raises:
    ValueError: ``loss`` has another sensitivity or adjacency.
  """
  if loss.sensitivity != 1 or loss.adjacency_type not in (_ADD, _REMOVE):
    raise ValueError(f"a Gaussian loss of sensitivity 1 under addition or removal is needed, "
                     f"got sensitivity {loss.sensitivity}, {loss.adjacency_type}")
  q, sigma = loss.sampling_prob, loss.standard_deviation
  smallest_removal_loss = math.log1p(-q) if q < 1 else -math.inf  # -(largest of addition)
  deltas = np.zeros_like(epsilons, dtype=float)
  if loss.adjacency_type == _ADD:
    inside = epsilons < -smallest_removal_loss
    x = 0.5 + sigma ** 2 * _log_subsampled(-epsilons[inside], q)
  else:
    inside = epsilons > smallest_removal_loss
    deltas[~inside] = -np.expm1(epsilons[~inside])
    x = -0.5 - sigma ** 2 * _log_subsampled(epsilons[inside], q)
  with np.errstate(invalid="ignore"):  # log-CDFs at x = -inf: logaddexp(-inf, -inf) = -inf
    deltas[inside] = loss.mu_upper_cdf(x) - np.exp(epsilons[inside] + loss.mu_lower_log_cdf(x))
  return np.clip(deltas, 0, 1)


def _log_subsampled(s: np.ndarray, q: float) -> np.ndarray:
  """``L(s) = log(1 + (e^s - 1) / q) = log(a e^s + c)``, ``a = 1 / q``, ``c = 1 - 1 / q``, for
  ``e^s > 1 - q``; ``-inf`` where they are equal to rounding.

  As ``dp_accounting`` evaluates it for ``c < 0``: ``d + log1p(-t)``, ``t = exp(log(-c) - d)``,
  ``d = s + log(a)``, and ``log(a + c)`` at ``s = 0``: the same bits on dp-accounting 0.4.3.
  Where rounding makes ``t >= 1`` (``s`` within a few ulps of ``log(1 - q)``), ``-inf``, the
  limit: ``x = -+inf``, as ``dp_accounting`` takes within ``1e-9`` of it.
  """
  if q == 1.0:
    return s
  d = s + np.log(1 / q)
  t = np.exp(np.log(1 / q - 1) - d)
  with np.errstate(divide="ignore", invalid="ignore"):
    logs = np.where(t >= 1, -np.inf, d + np.log1p(-t))
  return np.where(s == 0, np.log(1 / q + (1 - 1 / q)), logs)


__all__ = ["hockey_stick_deltas", "subsampled_gaussian_pld"]
