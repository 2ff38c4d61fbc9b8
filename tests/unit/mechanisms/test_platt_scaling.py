"""Private Platt scaling (``--calibration-share``): its mechanism, its epsilon, its effect."""

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from dp_accounting import pld
from scipy import stats

import sparse_dp
from sparse_dp import keras
from sparse_dp.accounting import PrivacyAccountant, calibrate_after
from sparse_dp.cli import main
from sparse_dp.jobs.train import private_calibration
from sparse_dp.mechanisms import bernoulli_positions
from sparse_dp.mechanisms.platt_scaling import PlattMechanism, PlattScaling, noisy_gradient_sum
from sparse_dp.models.calibration import log_loss
from sparse_dp.training.dp_state.state import saved_state

from support.stacks import ALPHA


def test_each_example_s_gradient_is_bounded_by_construction():
  # Logits far outside [-Z, Z], labels against them: one example's sum is its gradient.
  mechanism = PlattMechanism(noise_multiplier=1.0, logit_clip=3.0)
  for z, y, a, b in [(1e6, 0.0, 5.0, 2.0), (-1e6, 1.0, 5.0, -2.0), (0.3, 1.0, 1.0, 0.0)]:
    gradient = noisy_gradient_sum(tf.constant([z], tf.float64), tf.constant([y], tf.float64),
                                  tf.constant(a, tf.float64), tf.constant(b, tf.float64),
                                  tf.constant(0.0, tf.float64), 3.0, tf.constant([0, 0], tf.int64))
    assert np.linalg.norm(gradient.numpy()) <= mechanism.sensitivity == np.sqrt(10.0)


def test_the_noisy_gradient_is_the_sum_plus_gaussian_noise_of_sigma_c():
  rng = np.random.default_rng(0)
  z, y = tf.constant(rng.normal(-2, 3, 50)), tf.constant((rng.random(50) < 0.3) * 1.0)
  mechanism = PlattMechanism(noise_multiplier=0.7, logit_clip=4.0)
  std = 0.7 * np.sqrt(4.0 ** 2 + 1)  # sigma C
  args = (tf.constant(0.8, tf.float64), tf.constant(-0.5, tf.float64))
  exact = noisy_gradient_sum(z, y, *args, tf.constant(0.0, tf.float64), 4.0,
                             tf.constant([0, 0], tf.int64))
  noise = np.concatenate([
      (mechanism.noisy_gradient_sum(z, y, *args, tf.constant([7, t], tf.int64)) - exact).numpy()
      for t in range(1000)])
  n = noise.size
  assert stats.chi2.ppf(ALPHA / 2, n) <= np.sum((noise / std) ** 2) <= stats.chi2.isf(ALPHA / 2, n)
  assert abs(noise.mean()) <= stats.norm.isf(ALPHA / 2) * std / np.sqrt(n)


def test_the_calibration_s_sigma_composes_with_training_to_the_job_s_epsilon():
  q, steps, delta = 0.01, 100, 1e-5
  spent = PrivacyAccountant().step(1.0, q, steps)
  sigma = calibrate_after(spent, 2.0, delta, 50)
  # The composed event, built here from dp_accounting alone: training, then 50
  # full-batch Gaussian mechanisms of noise multiplier sigma.
  accountant = pld.PLDAccountant()
  accountant.compose(dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.0)),
                     steps)
  accountant.compose(dp_accounting.GaussianDpEvent(sigma), 50)
  composed = accountant.get_epsilon(delta)
  assert composed == pytest.approx(spent.step(sigma, 1.0, 50).get_epsilon(delta), rel=1e-3)
  assert 0.99 * 2.0 <= composed <= 2.0 * (1 + 1e-3)
  with pytest.raises(ValueError, match="already spent"):
    calibrate_after(PrivacyAccountant().step(1.0, q, steps), 0.1, delta, 50)


def test_steps_on_one_sample_are_one_gaussian_and_amplified_by_its_rate():
  # T Gaussian steps of sigma are the one Gaussian of sigma / sqrt(T): RDP adds exactly.
  rdp = dp_accounting.rdp.RdpAccountant()
  assert rdp.compose(dp_accounting.GaussianDpEvent(3.0), 50).get_epsilon(1e-6) == pytest.approx(
      dp_accounting.rdp.RdpAccountant().compose(
          dp_accounting.GaussianDpEvent(3.0 / np.sqrt(50))).get_epsilon(1e-6), rel=1e-12)
  # On one Poisson sample of rate 0.2: the sampled Gaussian, built from dp_accounting alone.
  spent, delta, rate = PrivacyAccountant().step(1.0, 0.01, 100), 1e-5, 0.2
  sigma = calibrate_after(spent, 2.0, delta, 50, sampling_rate=rate)
  accountant = pld.PLDAccountant()
  accountant.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.0)),
                     100)
  accountant.compose(dp_accounting.PoissonSampledDpEvent(
      rate, dp_accounting.GaussianDpEvent(sigma / np.sqrt(50))))
  assert 0.99 * 2.0 <= accountant.get_epsilon(delta) <= 2.0 * (1 + 1e-3)
  with pytest.raises(ValueError, match="sampling rate"):
    calibrate_after(spent, 2.0, delta, 50, sampling_rate=1.5)


def _logit_model() -> keras.Model:
  """``z = 3 x - 4``: a ranking as good as the truth's, its probabilities far too low."""
  inputs = keras.Input(shape=(1,))
  model = keras.Model(inputs, keras.layers.Dense(1, name="logit")(inputs))
  model.get_layer("logit").set_weights([np.array([[3.0]]), np.array([-4.0])])
  return model


def _auc(scores, labels) -> float:
  """The exact (Mann-Whitney) AUC."""
  ranks = stats.rankdata(scores)
  positives = labels == 1
  n1, n0 = positives.sum(), (~positives).sum()
  return (ranks[positives].sum() - n1 * (n1 + 1) / 2) / (n1 * n0)


def test_the_fitted_scaling_improves_log_loss_and_keeps_the_auc():
  rng = np.random.default_rng(1)
  x = rng.normal(0, 1, (20_000, 1))
  y = (rng.random((20_000, 1)) < 1 / (1 + np.exp(-x))).astype(np.float64)  # truth: z = x
  model = _logit_model()
  before = model.predict(x, verbose=0)
  train, held_out = slice(0, 15_000), slice(15_000, None)
  mechanism = PlattMechanism(noise_multiplier=5.0)
  scaling = PlattScaling.fit(before[train], y[train], mechanism, 15_000, noise_seed=3)
  scaling.fold_into(model.get_layer("logit"))
  after = model.predict(x, verbose=0)
  np.testing.assert_allclose(after, scaling.slope * before + scaling.intercept, atol=1e-5)
  assert scaling.slope > 0
  assert _auc(after[held_out].ravel(), y[held_out].ravel()) == _auc(
      before[held_out].ravel(), y[held_out].ravel())
  assert log_loss(after[held_out], y[held_out]) < log_loss(x[held_out], y[held_out]) + 0.01
  assert log_loss(after[held_out], y[held_out]) < 0.5 * log_loss(before[held_out], y[held_out])


def _trained_logit_model(config) -> tuple:
  """``_logit_model`` trained one epoch by ``make_private`` on 1,024 examples."""
  rng = np.random.default_rng(2)
  x = rng.normal(0, 1, (1024, 1)).astype(np.float32)
  y = (rng.random((1024, 1)) < 1 / (1 + np.exp(-x))).astype(np.float32)
  model = _logit_model()
  model.compile(optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  private = sparse_dp.make_private(model, config, num_examples=1024, batch_size=128)
  model.fit(private.poisson_dataset(x, y, epochs=1), verbose=0, callbacks=[private.callback()])
  return model, private, x, y


def test_the_saved_model_s_record_includes_the_calibration(tmp_path):
  config = sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0, epsilon_budget=None, noise_seed=1)
  model, private, x, y = _trained_logit_model(config)
  delta = 1 / 1024
  training = private.epsilon(delta=delta)
  recalibration = private_calibration.recalibrate(model, x, y, 2 * training, delta, noise_seed=1)
  assert recalibration.epsilon == pytest.approx(2 * training, rel=5e-3)
  assert recalibration.epsilon <= 2 * training * (1 + 1e-3)
  assert recalibration.calibration_epsilon == pytest.approx(recalibration.epsilon - training)
  model.save(tmp_path / "model")
  record = saved_state(str(tmp_path / "model"))
  platt = [run for run in record.runs if run.algorithm == private_calibration.PLATT_RUN]
  assert len(platt) == 1 and platt[0].sampling_rate == 1.0  # N <= CALIBRATION_EXAMPLES
  assert record.steps_by_run()[platt[0].run_id] == 1  # the T steps' one Gaussian
  assert platt[0].noise_multiplier == pytest.approx(
      recalibration.mechanism.noise_multiplier / np.sqrt(recalibration.mechanism.steps))
  reloaded = keras.models.load_model(tmp_path / "model")
  assert sparse_dp.make_private(reloaded, config, num_examples=1024, batch_size=128).epsilon(
      delta=delta) == pytest.approx(recalibration.epsilon, rel=1e-3)


def test_a_large_training_set_is_calibrated_on_a_poisson_sample(monkeypatch):
  monkeypatch.setattr(private_calibration, "CALIBRATION_EXAMPLES", 256)  # q = 256 / 1,024
  config = sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0, epsilon_budget=None, noise_seed=1)
  model, private, x, y = _trained_logit_model(config)
  delta, logits = 1 / 1024, model.predict(x, verbose=0)
  spent = private.accountant
  recalibration = private_calibration.recalibrate(model, x, y, 1.5 * spent.get_epsilon(delta),
                                                  delta, noise_seed=4)
  mechanism = recalibration.mechanism
  assert mechanism.sampling_rate == 0.25
  # The fit read the examples at the positions of one Bernoulli(q) draw keyed by the seed.
  sample = bernoulli_positions(
      1024, 0.25, tf.constant([4, private_calibration.SAMPLE_STREAM], tf.int64)).numpy()
  assert 0 < len(sample) < 1024
  assert recalibration.scaling == PlattScaling.fit(logits[sample], y[sample], mechanism, 256, 4)
  # Its epsilon: the training's events and the sample's one Gaussian, by dp_accounting.
  release = dp_accounting.GaussianDpEvent(mechanism.noise_multiplier / np.sqrt(mechanism.steps))
  event = dp_accounting.ComposedDpEvent(
      [spent.training_event(), dp_accounting.PoissonSampledDpEvent(0.25, release)])
  assert recalibration.epsilon == pytest.approx(
      pld.PLDAccountant().compose(event).get_epsilon(delta), rel=1e-3)


@pytest.mark.parametrize("share", ["-0.1", "1", "1.5"])
def test_bad_shares_are_refused_naming_the_flag(tmp_path, capsys, share):
  assert main(["train", "--calibration-share", share, "--max-examples", "100",
               "--out", str(tmp_path)]) == 2
  assert "--calibration-share must be in [0, 1)" in capsys.readouterr().err


def test_a_non_private_run_refuses_a_calibration_share(tmp_path, capsys):
  assert main(["train", "--algorithm", "none", "--calibration-share", "0.1",
               "--max-examples", "100", "--batch-size", "64", "--out", str(tmp_path)]) == 2
  assert "--algorithm none has none" in capsys.readouterr().err


@pytest.mark.parametrize("requested, private, reader, strategy, share", [
    (None, True, "pandas", "default", private_calibration.DEFAULT_SHARE),  # the default job
    (None, False, "pandas", "default", 0.0),  # non-private: nothing to calibrate privately
    (None, True, "tfdata", "default", 0.0),  # streamed examples: not in memory to fit on
    (None, True, "batches", "default", 0.0),
    (None, True, "pandas", "ps", 0.0),  # a cluster's workers hold parts of the data
    (None, True, "pandas", "multi-worker", 0.0),
    (0.0, True, "pandas", "default", 0.0),  # turned off
    (0.2, True, "pandas", "default", 0.2)])
def test_the_job_calibrates_a_private_in_memory_run_by_default(requested, private, reader,
                                                                strategy, share):
  assert private_calibration.job_share(requested, private, reader, strategy) == share


def test_an_explicit_bad_share_is_refused_even_where_the_default_is_off():
  with pytest.raises(ValueError, match="--calibration-share must be in"):
    private_calibration.job_share(1.0, True, "tfdata", "default")
