"""The audit's power: the ideal mechanism's privacy, the simulated audits, the smallest
true epsilon flagged."""

import dp_accounting
import numpy as np
import pytest

from sparse_dp.jobs.audit import one_run, power


@pytest.mark.parametrize("epsilon,delta", [(1.0, 1e-6), (4.0, 1e-6), (4.0, 1e-5)])
def test_the_ideal_mechanism_is_exactly_epsilon_delta_dp_by_the_accountant(epsilon, delta):
  """N(mu, 1) vs N(0, 1) is the Gaussian mechanism of noise multiplier 1 / mu."""
  mu = power.gaussian_shift(epsilon, delta)
  accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
  accountant.compose(dp_accounting.GaussianDpEvent(1 / mu))
  assert accountant.get_epsilon(delta) == pytest.approx(epsilon, abs=2e-3)
  with pytest.raises(ValueError, match="0 < delta < 1"):
    power.gaussian_shift(epsilon, 0.0)


def test_simulated_flags_are_the_audits_own_verdicts():
  pairs = one_run.k_pairs(200)
  ideal = power.IdealAudit(1.0, 200, 1e-6, 0.05, pairs, scores=1, trials=40, seed=3)
  scores, flagged = ideal.scores(6.0), ideal.flagged(6.0)
  verdicts = [one_run.audit({"ideal": s}, inc, 1e-6, 0.05, pairs=pairs).epsilon_lower_bound > 1.0
              for s, inc in zip(scores, ideal.included)]
  np.testing.assert_array_equal(flagged, verdicts)
  assert 0 < flagged.mean() < 1  # both verdicts occur: the comparison is not vacuous


def test_a_true_epsilon_at_the_claim_is_flagged_at_most_beta_of_the_time():
  ideal = power.IdealAudit(2.0, 500, 1e-6, 0.05, one_run.k_pairs(500), scores=1, trials=1000)
  assert ideal.flag_rate(2.0) <= 0.05


def test_power_at_1000_canaries_and_the_smallest_epsilon_flagged():
  """The measured power of the audit's tries (3 scores): an ideal mechanism of true epsilon
  4 is flagged above a claim of 1 in about 73% of runs at m = 1000, delta = 1e-6."""
  ideal = power.IdealAudit(1.0, 1000, 1e-6, 0.05, one_run.k_pairs(1000), scores=3, trials=1000)
  assert ideal.flag_rate(4.0) == pytest.approx(0.73, abs=0.05)
  smallest = ideal.smallest_flagged_epsilon(0.95)
  assert 4.0 < smallest < 5.0
  assert ideal.flag_rate(smallest) >= 0.95 > ideal.flag_rate(smallest - 0.02)
  tiny = power.IdealAudit(1.0, 8, 1e-6, 0.05, one_run.k_pairs(8), scores=3, trials=100)
  assert tiny.smallest_flagged_epsilon() is None  # 8 canaries can never show epsilon > 1
