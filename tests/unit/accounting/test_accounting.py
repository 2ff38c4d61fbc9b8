"""Accounting equals independent dp_accounting computations and TF Privacy's RDP bound."""

import math

import dp_accounting
import pytest
from dp_accounting import pld, rdp

from sparse_dp.accounting import (
  BatchSchedule,
  PrivacyAccountant,
  PrivacyReport,
  PrivacySpec,
  TopKSelectionCost,
  UnreachableTargetError,
  calibrate,
  effective_noise_multiplier,
  gaussian_steps_event,
  split_noise_multiplier,
  steps_for_epochs,
)
from sparse_dp.accounting.discretization import pld_interval

from support.stacks import SAME_PLD_BITS, requires_tf_privacy

N = 1_000_000
Q = 1024 / N


def independent_epsilon(noise_multiplier, sampling_rate, steps, delta, kind="pld"):
  """DP-SGD epsilon straight from dp_accounting, as a reviewer would compute it."""
  accountant = pld.PLDAccountant() if kind == "pld" else rdp.RdpAccountant()
  event = dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(
          sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)), steps)
  return accountant.compose(event).get_epsilon(delta)


@pytest.mark.parametrize("kind", ["pld", "rdp"])
def test_dpsgd_matches_dp_accounting(kind):
  spec = PrivacySpec("dpsgd", BatchSchedule.constant(Q, 2000), noise_multiplier=0.9)
  report = PrivacyReport.compute(spec, 1 / N, kind)
  assert report.epsilon == pytest.approx(independent_epsilon(0.9, Q, 2000, 1 / N, kind),
                                         rel=1e-9)
  assert report.accountant == kind


def test_the_step_caching_pld_accountant_gives_dp_accountings_epsilon_bit_for_bit():
  """Each distinct step's PLD is built once and reused: the same epsilon as dp_accounting's
  own accountant, on every event a run composes; the same delta too, to the bit on
  dp-accounting 0.4.3 and to float rounding on 0.6 (``test_gaussian_pld.py``)."""
  from sparse_dp.accounting.accountant import StepCachingPLDAccountant
  two_runs = dp_accounting.ComposedDpEvent([
      gaussian_steps_event(1.3, Q, 700), gaussian_steps_event(0.8, 2 * Q, 300),
      gaussian_steps_event(1.3, Q, 50)])  # the first step again: built once
  unsampled = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(20.0), 3)
  one_run = gaussian_steps_event(0.9, Q, 2000)
  cases = [(1e-4, one_run)] + [  # the default grid, and the steps kept apart by grid
      (1e-3, event) for event in (one_run, two_runs, unsampled,
                                  dp_accounting.ComposedDpEvent([two_runs, unsampled]))]
  for interval, event in cases:
    plain = pld.PLDAccountant(value_discretization_interval=interval).compose(event)
    for repeat in range(2):  # built, then reused
      cached = StepCachingPLDAccountant(value_discretization_interval=interval).compose(event)
      assert cached.get_epsilon(1 / N) == plain.get_epsilon(1 / N), (interval, event, repeat)
      assert cached.get_delta(2.0) == pytest.approx(plain.get_delta(2.0),
                                                    abs=0 if SAME_PLD_BITS else 1e-12)
  assert isinstance(PrivacyAccountant("pld").kind.new(), StepCachingPLDAccountant)


def test_adafest_is_one_gaussian_of_combined_noise():
  sigma1, sigma2 = 5.0, 1.1
  combined = (sigma1 ** -2 + sigma2 ** -2) ** -0.5
  assert effective_noise_multiplier(sigma1, sigma2) == pytest.approx(combined)
  spec = PrivacySpec("adafest", BatchSchedule.constant(Q, 3000), sigma1=sigma1, sigma2=sigma2)
  epsilon = PrivacyReport.compute(spec, 1 / N).epsilon
  assert epsilon == pytest.approx(independent_epsilon(combined, Q, 3000, 1 / N), rel=1e-9)
  # Two mechanisms cost more than the gradient noise alone would.
  assert epsilon > independent_epsilon(sigma2, Q, 3000, 1 / N)


def test_fest_adds_selection_epsilon_to_training():
  # test_dpsgd_matches_dp_accounting's steps: their PLD is built once per process.
  spec = PrivacySpec("fest", BatchSchedule.constant(Q, 2000), noise_multiplier=0.9,
                     selection_epsilon=0.05)
  report = PrivacyReport.compute(spec, 1 / N)
  training = independent_epsilon(0.9, Q, 2000, 1 / N)
  assert report.training_epsilon == pytest.approx(training, rel=1e-9)
  assert report.epsilon == pytest.approx(training + 0.05, rel=1e-9)


def test_adafest_plus_composes_selection_with_combined_gaussian():
  # test_adafest_is_one_gaussian_of_combined_noise's steps: their PLD is built once per process.
  spec = PrivacySpec("adafest+", BatchSchedule.constant(Q, 3000), sigma1=5.0, sigma2=1.1,
                     selection_epsilon=0.01)
  expected = 0.01 + independent_epsilon(effective_noise_multiplier(5.0, 1.1), Q, 3000, 1 / N)
  assert PrivacyReport.compute(spec, 1 / N).epsilon == pytest.approx(expected, rel=1e-9)


def test_batch_size_schedule_composes_phases_as_separate_events():
  schedule = BatchSchedule.from_batch_sizes(N, [1024, 2048, 4096], [500, 300, 200])
  spec = PrivacySpec("dpsgd", schedule, noise_multiplier=1.0)
  event = dp_accounting.ComposedDpEvent([
      dp_accounting.SelfComposedDpEvent(
          dp_accounting.PoissonSampledDpEvent(b / N, dp_accounting.GaussianDpEvent(1.0)), s)
      for b, s in [(1024, 500), (2048, 300), (4096, 200)]
  ])
  expected = pld.PLDAccountant().compose(event).get_epsilon(1 / N)
  report = PrivacyReport.compute(spec, 1 / N)
  assert report.epsilon == pytest.approx(expected, rel=1e-9)
  assert report.to_dict()["steps"] == 1000
  assert report.to_dict()["sampling_rate"] == [1024 / N, 2048 / N, 4096 / N]
  # Not the same as pretending every step had the mean sampling rate.
  mean_rate = (1024 * 500 + 2048 * 300 + 4096 * 200) / 1000 / N
  assert abs(expected - independent_epsilon(1.0, mean_rate, 1000, 1 / N)) > 1e-3


@requires_tf_privacy
def test_pld_is_at_most_tf_privacy_rdp():
  from tensorflow_privacy.privacy.analysis import compute_dp_sgd_privacy_lib
  for n, batch, sigma, epochs in [(60_000, 256, 1.1, 15), (N, 2048, 0.8, 3),
                                  (50_000, 500, 2.0, 50)]:
    delta = 1 / n
    rdp_epsilon, _ = compute_dp_sgd_privacy_lib.compute_dp_sgd_privacy(
        n, batch, sigma, epochs, delta)
    steps = int(math.ceil(epochs * n / batch))
    spec = PrivacySpec("dpsgd", BatchSchedule.constant(batch / n, steps), noise_multiplier=sigma)
    pld_epsilon = PrivacyReport.compute(spec, delta).epsilon
    assert 0 < pld_epsilon <= rdp_epsilon


# The selection's epsilon leaves fest and adafest+ the training targets of adafest and dpsgd-3.0:
# one noise search each (its PLDs built once per process), checked from their own deduction.
@pytest.mark.parametrize("algorithm,target,extra", [
    ("dpsgd", 0.5, {}), ("dpsgd", 3.0, {}), ("fest", 1.01, {"selection_epsilon": 0.01}),
    ("adafest", 1.0, {"sigma_ratio": 5.0}),
    ("adafest+", 3.1, {"sigma_ratio": 2.0, "selection_epsilon": 0.1})])
def test_calibration_round_trips(algorithm, target, extra):
  schedule = BatchSchedule.constant(Q, 1000)
  spec = calibrate(algorithm, target, 1 / N, schedule, **extra)
  # Recompute independently from the returned noise.
  sigma = (spec.noise_multiplier if spec.noise_multiplier is not None
           else (spec.sigma1 ** -2 + spec.sigma2 ** -2) ** -0.5)
  epsilon = extra.get("selection_epsilon", 0.0) + independent_epsilon(sigma, Q, 1000, 1 / N)
  assert 0.98 * target <= epsilon <= target
  if "sigma_ratio" in extra:
    assert spec.sigma1 / spec.sigma2 == pytest.approx(extra["sigma_ratio"])


def test_calibration_with_rdp_meets_rdp_target():
  spec = calibrate("dpsgd", 1.0, 1e-6, BatchSchedule.constant(0.01, 500), "rdp")
  epsilon = independent_epsilon(spec.noise_multiplier, 0.01, 500, 1e-6, "rdp")
  assert 0.98 <= epsilon <= 1.0


def test_unreachable_targets_are_refused():
  with pytest.raises(UnreachableTargetError, match="leaves nothing for training"):
    calibrate("fest", 0.01, 1e-6, BatchSchedule.constant(Q, 10), selection_epsilon=0.01)
  with pytest.raises(UnreachableTargetError, match="above"):
    calibrate("dpsgd", 1e-4, 1e-6, BatchSchedule.constant(1.0, 10_000))
  # Met below the searched noise: refused before the PLD is asked about a noise
  # it cannot discretise.
  with pytest.raises(UnreachableTargetError, match="protects nothing"):
    calibrate("dpsgd", 1e5, 1e-6, BatchSchedule.constant(Q, 1000))
  with pytest.raises(UnreachableTargetError, match="leaves nothing for training"):
    calibrate("adafest+", 0.05, 1e-6, BatchSchedule.constant(Q, 10), selection_epsilon=0.1)


def test_pld_grid_is_widened_only_where_the_default_would_not_fit():
  ordinary = gaussian_steps_event(1.0, Q, 3000)
  assert pld_interval(ordinary) == 1e-4
  small_noise = gaussian_steps_event(0.1, 0.1, 1000)  # 5.6 GB at the default grid
  interval = pld_interval(small_noise)
  assert interval > 1e-4
  # Still far tighter than RDP, the bound it would otherwise fall back to.
  accountant = PrivacyAccountant().step(0.1, 0.1, 1000)
  assert accountant.get_epsilon(1e-6) < 0.5 * independent_epsilon(0.1, 0.1, 1000, 1e-6, "rdp")


def test_the_few_orders_shortcut_gives_the_all_orders_interval():
  """The grid from a few RDP orders, where they suffice, is the one all the orders give."""
  from sparse_dp.accounting import discretization
  checked = set()
  for sigma in (0.05, 0.1, 0.3, 1.0, 5.0):
    for q in (1e-4, 0.01, 0.1, 0.5, 1.0):
      for steps in (1, 100, 10_000):
        event = gaussian_steps_event(sigma, q, steps)
        loss_range = rdp.RdpAccountant().compose(event).get_epsilon(discretization._TAIL_DELTA)
        for interval in (1e-4, 1e-3):
          full = max(interval, loss_range / discretization.MAX_LOSS_POINTS)
          assert pld_interval(event, interval) == full, (sigma, q, steps, interval)
          checked.add(full > interval)
  assert checked == {True, False}  # both branches taken


def test_accountant_step_by_step_equals_bulk():
  stepwise = PrivacyAccountant()
  for _ in range(50):
    stepwise.step(1.0, Q)
  bulk = PrivacyAccountant().step(1.0, Q, 50)
  assert stepwise.steps == 50
  assert stepwise.get_epsilon(1e-6) == pytest.approx(bulk.get_epsilon(1e-6), rel=1e-12)
  before = stepwise.get_epsilon(1e-6)
  after = stepwise.epsilon_after(1e-6, 1.0, Q, 10)
  assert after > before
  assert stepwise.get_epsilon(1e-6) == before  # a hypothetical query spends nothing
  assert PrivacyAccountant().get_epsilon(1e-6) == 0.0


def test_each_epsilon_is_composed_once_per_process_and_a_step_asks_anew():
  from sparse_dp.accounting.accountant import _training_epsilon
  accountant = PrivacyAccountant().step(1.0, Q, 100)
  first = accountant.get_epsilon(1e-6)
  before = _training_epsilon.cache_info()
  assert PrivacyAccountant().step(1.0, Q, 60).step(1.0, Q, 40).get_epsilon(1e-6) == first
  assert _training_epsilon.cache_info().hits == before.hits + 1  # the same 100 steps
  accountant.step(1.0, Q, 1)
  assert accountant.get_epsilon(1e-6) > first  # not the cached answer of 100 steps
  assert accountant.spend_pure(0.25).get_epsilon(1e-6) == accountant.get_training_epsilon(
      1e-6) + 0.25


def test_accountant_includes_pure_spends():
  accountant = PrivacyAccountant().spend_pure(0.2).step(1.0, Q, 100)
  assert accountant.get_epsilon(1e-6) == pytest.approx(
      0.2 + independent_epsilon(1.0, Q, 100, 1e-6), rel=1e-9)


def test_noise_split_round_trips():
  sigma1, sigma2 = split_noise_multiplier(0.7, 5.0)
  assert sigma1 / sigma2 == pytest.approx(5.0)
  assert effective_noise_multiplier(sigma1, sigma2) == pytest.approx(0.7)


def test_top_k_cost_splits_budget_and_sets_gumbel_scale():
  cost = TopKSelectionCost.split_evenly(0.26, [1000] * 26)
  assert cost.epsilon == pytest.approx(0.26)
  # k picks of epsilon/k each: scale k / epsilon_f, not the paper's 1 / epsilon.
  assert cost.gumbel_scale(0) == pytest.approx(1000 / 0.01)


@pytest.mark.parametrize("bad,match", [
    (dict(noise_multiplier=-1.0), "noise multiplier must be"),
    (dict(noise_multiplier=0.0), "noise multiplier must be"),
    (dict(sigma1=1.0, sigma2=1.0), "takes a noise multiplier"),
])
def test_bad_specs_are_rejected(bad, match):
  with pytest.raises(ValueError, match=match):
    PrivacySpec("dpsgd", BatchSchedule.constant(Q, 10), **bad)


def test_bad_schedules_are_rejected():
  with pytest.raises(ValueError, match="sampling rate must be in"):
    BatchSchedule.constant(1.5, 10)
  with pytest.raises(ValueError, match="steps must be"):
    BatchSchedule.constant(0.1, -1)
  assert steps_for_epochs(2, 0.25) == 8
