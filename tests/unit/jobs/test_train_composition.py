"""The train job's budget split: top-k preselection, training and calibration compose to the target.

The fast proof of what ``sparse-dp train --compare`` shows end to end
(tests/e2e/test_train_job.py): the job's own entry point (``train_and_evaluate``)
and DP config (``_dp_config``), with the fit replaced by a stub, at the job's settings.
"""

import dataclasses
import types

import numpy as np
import pytest

from sparse_dp.accounting import (
  Algorithm,
  BatchSchedule,
  PrivacyAccountant,
  PrivacyReport,
  PrivacySpec,
  calibrate_after,
  effective_noise_multiplier,
  steps_for_epochs,
)
from sparse_dp.accounting.adafest_defaults import adafest_settings
from sparse_dp.jobs.train import fitting
from sparse_dp.jobs.train.job_flags import FitSettings
from sparse_dp.mechanisms.platt_scaling import DEFAULT_STEPS

N, BATCH, SIZES = 2_500, 256, [30, 40]


def training_inputs():
  rng = np.random.default_rng(0)
  ids = np.stack([rng.integers(0, size, N) for size in SIZES], axis=1).astype(np.int64)
  return ({"categorical": ids, "integers": np.zeros((N, 13), np.float32)},
          rng.integers(0, 2, (N, 1)).astype(np.float32))


def trained_settings(monkeypatch, algorithm, settings, **shares):
  """The settings ``train_and_evaluate`` hands its fit, and the preselection it made."""
  seen = {}

  def stub(algorithm, settings, train, held_out, sizes, preselection=None, observers=(),
           phases=None):
    seen.update(settings=settings, preselection=preselection)
    return types.SimpleNamespace(metrics={"poisson_sampling": True})

  monkeypatch.setattr(fitting, "fit_and_evaluate", stub)
  fitting.train_and_evaluate(algorithm, settings, training_inputs(), None, SIZES, fest_k=10,
                             **shares)
  return seen["settings"], seen["preselection"]


def accounted_epsilon(config, settings) -> float:
  """The epsilon the accountant gives the DP config the job trains with (its selection too)."""
  q = BATCH / N
  spec = PrivacySpec(config.algorithm, BatchSchedule.constant(q, steps_for_epochs(1.0, q)),
                     noise_multiplier=config.noise_multiplier, sigma1=config.sigma1,
                     sigma2=config.sigma2, selection_epsilon=config.selection_epsilon)
  return PrivacyReport.compute(spec, 1.0 / N).epsilon


@pytest.mark.parametrize("algorithm", ["fest", "adafest+", "dpsgd", "adafest"])
def test_the_top_k_share_and_the_training_compose_to_the_target(monkeypatch, algorithm):
  target = FitSettings(epsilon=1.0, batch_size=BATCH, noise_seed=3)
  settings, preselection = trained_settings(monkeypatch, algorithm, target,
                                            selection_share=0.1)
  kind = Algorithm.parse(algorithm)
  if kind.uses_top_k_selection:
    assert preselection.epsilon == pytest.approx(0.1)
    assert settings.selection_epsilon == pytest.approx(0.1)
    assert max(len(k) for k in preselection.kept_buckets) == 10
  else:
    assert preselection is None and settings.selection_epsilon == 0
  assert settings.epsilon + settings.selection_epsilon == pytest.approx(1.0)
  config = fitting._dp_config(kind, settings, N, BATCH, SIZES)
  assert config.epsilon_budget == pytest.approx(1.0)
  assert 0.95 < accounted_epsilon(config, settings) <= 1.0 + 1e-9


def test_a_calibration_share_comes_out_of_the_same_target(monkeypatch):
  target = FitSettings(epsilon=1.0, batch_size=BATCH, noise_seed=3)
  calibrated = []
  monkeypatch.setattr(fitting, "_calibrate",
                      lambda fit, train, held_out, preselection, job_epsilon, seed:
                      calibrated.append(job_epsilon))
  settings, preselection = trained_settings(monkeypatch, "adafest+", target,
                                            selection_share=0.1, calibration_share=0.05)
  # Calibration takes 0.05 of the whole; the top-k 0.1 of what is left for training.
  assert calibrated == [1.0]
  assert preselection.epsilon == pytest.approx(0.1 * 0.95)
  assert settings.epsilon + settings.selection_epsilon == pytest.approx(0.95)
  config = fitting._dp_config(Algorithm.ADAFEST_PLUS, settings, N, BATCH, SIZES)
  assert accounted_epsilon(config, dataclasses.replace(settings)) <= 0.95 + 1e-9


def test_the_calibration_after_a_top_k_and_training_brings_the_whole_run_to_the_target(
    monkeypatch):
  """The three spends composed by the accountant the job's record holds: the top-k's pure
  epsilon, the training's Poisson Gaussians, then the Platt scaling calibrated to the rest."""
  target, delta = 1.0, 1.0 / N
  monkeypatch.setattr(fitting, "_calibrate", lambda *args: None)  # the spend is checked here
  settings, preselection = trained_settings(
      monkeypatch, "adafest+", FitSettings(epsilon=target, batch_size=BATCH, noise_seed=3),
      selection_share=0.1, calibration_share=0.05)
  config = fitting._dp_config(Algorithm.ADAFEST_PLUS, settings, N, BATCH, SIZES)
  q = BATCH / N
  spent = PrivacyAccountant().spend_pure(preselection.epsilon).step_schedule(
      effective_noise_multiplier(config.sigma1, config.sigma2),
      BatchSchedule.constant(q, steps_for_epochs(1.0, q)))
  assert spent.get_epsilon(delta) <= 0.95 + 1e-9
  sigma = calibrate_after(spent, target, delta, DEFAULT_STEPS)
  whole = spent.step(sigma, 1.0, DEFAULT_STEPS).get_epsilon(delta)
  assert 0.99 * target <= whole <= target * (1 + 1e-3)


@pytest.mark.parametrize("dense_tables, sparse_rows", [((), 70), (("embedding_0",), 40)])
def test_the_job_takes_adafest_s_threshold_and_ratio_by_rule_from_its_sparse_tables(
    dense_tables, sparse_rows):
  settings = FitSettings(epsilon=1.0, batch_size=BATCH, dense_tables=dense_tables)
  config = fitting._dp_config(Algorithm.ADAFEST, settings, N, BATCH, SIZES)
  rule = adafest_settings([sparse_rows], BATCH)
  assert (config.threshold_sigmas, config.sigma_ratio) == rule
  assert config.sigma1 / config.sigma2 == pytest.approx(rule.sigma_ratio)
  given = fitting._dp_config(Algorithm.ADAFEST, dataclasses.replace(
      settings, tau_sigmas=4.0, sigma_ratio=2.0), N, BATCH, SIZES)
  assert (given.threshold_sigmas, given.sigma_ratio) == (4.0, 2.0)
  assert effective_noise_multiplier(given.sigma1, given.sigma2) == pytest.approx(
      effective_noise_multiplier(config.sigma1, config.sigma2))
