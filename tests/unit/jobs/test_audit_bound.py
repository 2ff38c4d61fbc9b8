"""The one-run epsilon lower bound, guesses and exposure, against direct computations."""

import math

import numpy as np
import pytest
from scipy import stats

from sparse_dp.jobs.audit import bound, exposure, one_run


def direct_tail(eps: float, guesses: int, correct: int) -> float:
  """P[Binomial(guesses, e^eps / (1 + e^eps)) >= correct] by summing the pmf."""
  p = math.exp(eps) / (1 + math.exp(eps))
  return sum(math.comb(guesses, j) * p ** j * (1 - p) ** (guesses - j)
             for j in range(correct, guesses + 1))


@pytest.mark.parametrize("guesses,correct", [(100, 70), (100, 100), (500, 400), (40, 31)])
def test_pure_bound_is_where_the_binomial_tail_reaches_beta(guesses, correct):
  eps = bound.epsilon_lower_bound(guesses, correct, canaries=1000, delta=0.0, beta=0.05)
  assert eps > 0
  assert direct_tail(eps, guesses, correct) <= 0.05 * (1 + 1e-9)
  assert direct_tail(eps + 1e-3, guesses, correct) > 0.05


def test_all_correct_bound_in_closed_form_and_cap_in_the_docstring():
  p = 0.05 ** (1 / 100)
  assert bound.epsilon_lower_bound(100, 100, 100, 0.0, 0.05) == pytest.approx(
      math.log(p / (1 - p)))
  assert bound.epsilon_lower_bound(100, 100, 100, 0.0, 0.05 / 24) == pytest.approx(2.75, abs=0.01)
  assert bound.epsilon_lower_bound(500, 500, 1000, 0.0, 0.05 / 24) == pytest.approx(4.4, abs=0.02)


def test_no_bound_when_guesses_are_at_chance():
  assert bound.epsilon_lower_bound(100, 55, 200, 0.0, 0.05) == 0.0
  assert bound.epsilon_lower_bound(0, 0, 200, 0.0, 0.05) == 0.0


def test_delta_term_only_lowers_the_bound():
  assert bound.tail_bound([0.5], 100, 80, 1000, 0.0)[0] == pytest.approx(
      direct_tail(0.5, 100, 80))
  pure = bound.epsilon_lower_bound(200, 180, 1000, 0.0, 0.05)
  small = bound.epsilon_lower_bound(200, 180, 1000, 1e-6, 0.05)
  large = bound.epsilon_lower_bound(200, 180, 1000, 1e-3, 0.05)
  assert large < small <= pure and small > pure - 0.05
  # The bound is the last grid point (0.01) before the (eps, delta) tail exceeds beta.
  assert bound.tail_bound([large], 200, 180, 1000, 1e-3)[0] <= 0.05
  assert bound.tail_bound([large + 0.01], 200, 180, 1000, 1e-3)[0] > 0.05


def test_bad_input_is_refused_by_name():
  with pytest.raises(ValueError, match="correct"):
    bound.epsilon_lower_bound(10, 11, 20, 0.0, 0.05)
  with pytest.raises(ValueError, match="beta"):
    bound.epsilon_lower_bound(10, 5, 20, 0.0, 1.0)
  with pytest.raises(ValueError, match="delta"):
    bound.epsilon_lower_bound(10, 5, 20, 1.0, 0.05)


def test_epsilon_zero_guessing_gives_zero_at_the_right_false_positive_rate():
  """Random scores (a 0-DP 'mechanism'): the bound is 0 but with probability <= beta."""
  rng = np.random.default_rng(0)
  trials, m, k = 3000, 200, 50
  bounds = []
  for _ in range(trials):
    included = rng.random(m) < 0.5
    correct = one_run.correct_guesses(rng.random(m), included, k, k, np.arange(m))
    bounds.append(bound.epsilon_lower_bound(2 * k, correct, m, 0.0, 0.05))
  rate = np.mean(np.array(bounds) > 0)
  threshold = int(stats.binom.isf(0.05, 2 * k, 0.5)) + 1  # smallest count rejecting eps = 0
  exact = stats.binom.sf(threshold - 1, 2 * k, 0.5)
  assert exact <= 0.05
  assert abs(rate - exact) < 4 * math.sqrt(exact * (1 - exact) / trials)
  assert np.max(bounds) < 0.5


def test_the_audit_over_all_tries_holds_at_beta_for_randomized_response():
  """A mechanism exactly eps-DP per canary: P[bound > eps] <= beta over the k+/k- search."""
  eps, m, trials = 1.0, 400, 500
  rng = np.random.default_rng(1)
  p = math.exp(eps) / (1 + math.exp(eps))
  above, bounds = 0, []
  for _ in range(trials):
    included = rng.random(m) < 0.5
    told = np.where(rng.random(m) < p, included, ~included)  # randomized response
    scores = {"rr": told + 0.01 * rng.random(m)}
    result = one_run.audit(scores, included, delta=0.0, beta=0.05, tie_seed=0)
    bounds.append(result.epsilon_lower_bound)
    above += result.epsilon_lower_bound > eps
  assert above / trials <= 0.05
  assert 0.2 < np.median(bounds) < eps  # the audit sees most of it, never more


def test_k_pairs_reach_half_the_canaries_per_side_and_share_beta():
  assert one_run.k_pairs(128) == [(4, 4), (8, 8), (16, 16), (32, 32), (64, 64),
                                  (32, 0), (64, 0)]
  assert (500, 500) in one_run.k_pairs(1000)  # every canary guessed
  assert one_run.k_pairs(1000)[-2:] == [(250, 0), (500, 0)]
  included = np.arange(128) < 64
  scores = {"perfect": included.astype(float), "other": np.zeros(128)}
  result = one_run.audit(scores, included, delta=0.0, beta=0.05)
  best = result.best()
  assert (best.score, best.k_plus, best.k_minus, best.correct) == ("perfect", 64, 64, 128)
  assert best.epsilon_lower_bound == pytest.approx(
      bound.epsilon_lower_bound(128, 128, 128, 0.0, 0.05 / 14))
  with pytest.raises(ValueError, match="score 'other'"):
    one_run.audit({"other": np.zeros(5)}, included, 0.0)


def appendix_d_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
  """The paper's Appendix D ``p_value_DP_audit``, line for line."""
  q = 1 / (1 + math.exp(-eps))
  beta = stats.binom.sf(v - 1, r, q)
  alpha, total = 0.0, 0.0
  for i in range(1, v + 1):
    total += stats.binom.pmf(v - i, r, q)
    if total > i * alpha:
      alpha = total / i
  return min(beta + alpha * delta * 2 * m, 1)


def appendix_d_epsilon(m: int, r: int, v: int, delta: float, p: float) -> float:
  """The paper's Appendix D ``get_eps_audit``: bisection on the p-value."""
  low, high = 0.0, 1.0
  while appendix_d_p_value(m, r, v, high, delta) < p:
    high += 1
  for _ in range(30):
    middle = (low + high) / 2
    low, high = (middle, high) if appendix_d_p_value(m, r, v, middle, delta) < p else (low, middle)
  return low


# (m, r, v, delta, p) -> the paper's Appendix D code's lower bound, to 4 decimals.
APPENDIX_D = {(1000, 100, 100, 1e-5, 0.05): 3.4654, (1000, 500, 500, 1e-5, 0.05): 5.0875,
              (1000, 1000, 1000, 1e-5, 0.05): 5.7823, (1000, 1000, 900, 1e-5, 0.05): 2.0206,
              (1000, 200, 180, 1e-5, 0.05): 1.7963, (5000, 1000, 950, 1e-5, 0.05): 2.6965,
              (1000, 100, 80, 1e-6, 0.01): 0.8029, (100, 100, 90, 0.0, 0.05): 1.6308}


@pytest.mark.parametrize("case", sorted(APPENDIX_D))
def test_bound_is_the_papers_appendix_d_code_to_the_grid_step(case):
  """Theorem 3.1's bound as the paper computes it (Steinke, Nasr, Jagielski, NeurIPS 2023,
  Appendix D): ours is its last 0.01 grid point at or below the paper's value."""
  m, r, v, delta, p = case
  paper = appendix_d_epsilon(m, r, v, delta, p)
  assert paper == pytest.approx(APPENDIX_D[case], abs=1e-4)
  ours = bound.epsilon_lower_bound(r, v, m, delta, p)
  assert paper - 0.01 <= ours <= paper + 1e-9 * (delta == 0) + 1e-6


def test_exposure_ranks_an_inserted_canary_among_the_excluded():
  included = np.array([True, False, False, False, True, False, False, False])
  scores = np.array([10.0, 1, 2, 3, 2.0, 0, -1, -2])
  # Candidates: itself and the 6 excluded. Canary 0 ranks 1st; canary 4 ties with
  # the excluded 2 (mid rank 2.5: one above it, one tie).
  assert exposure.exposures(scores, included) == pytest.approx(
      [math.log2(7), math.log2(7) - math.log2(2.5)])
  summary = exposure.exposure_summary(scores, included)
  assert summary["candidates"] == 7 and summary["max_possible"] == pytest.approx(math.log2(7))
  uniform = np.mean([math.log2(7) - math.log2(r) for r in range(1, 8)])
  assert exposure.chance_exposure(7) == pytest.approx(uniform)
