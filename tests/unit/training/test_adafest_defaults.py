"""DP-AdaFEST's threshold and noise ratio by rule when unset (docs/adafest_defaults.md)."""

import math

import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.accounting.adafest_defaults import (
  THRESHOLD_TIMES_RATIO,
  adafest_settings,
  default_threshold_sigmas,
)
from sparse_dp.layers import Embedding
from sparse_dp.mechanisms.selection.row_selection import false_positive_probability

PCTR_ROWS = 338_834  # the default job's 26 hashed tables


@pytest.mark.parametrize("sizes, batch", [([PCTR_ROWS], 2048), ([100_000, 2_000_000], 1024),
                                          ([5_000, 700], 256), ([10**7], 64)])
def test_the_rule_s_threshold_lets_one_percent_of_the_batch_through_as_false_positives(
    sizes, batch):
  t = default_threshold_sigmas(sizes, batch)
  assert sum(sizes) * false_positive_probability(t, 1.0) == pytest.approx(0.01 * batch, rel=1e-9)


def test_the_threshold_rises_with_the_rows_and_falls_with_the_batch_down_to_one_sigma():
  thresholds = [default_threshold_sigmas([rows], 1024) for rows in (10**3, 10**4, 10**6, 10**8)]
  assert thresholds == sorted(thresholds) and thresholds[0] < 2.5 < 5 < thresholds[-1]
  assert default_threshold_sigmas([10**6], 4096) < default_threshold_sigmas([10**6], 256)
  assert default_threshold_sigmas([10], 1024) == 1.0  # 10 false positives would be all rows
  assert default_threshold_sigmas([], 1024) == 1.0  # no table to select rows of
  assert default_threshold_sigmas([PCTR_ROWS], 2048) == pytest.approx(3.8443, abs=1e-4)


def test_given_settings_are_kept_and_the_ratio_follows_the_threshold():
  rule = adafest_settings([PCTR_ROWS], 2048)
  assert rule.threshold_sigmas * rule.sigma_ratio == pytest.approx(THRESHOLD_TIMES_RATIO)
  assert adafest_settings([PCTR_ROWS], 2048, threshold_sigmas=2.0) == (2.0, 4.0)
  assert adafest_settings([PCTR_ROWS], 2048, sigma_ratio=5.0) == (rule.threshold_sigmas, 5.0)
  assert adafest_settings([PCTR_ROWS], 2048, 6.0, 0.5) == (6.0, 0.5)


def test_dp_config_leaves_them_to_the_rule_and_refuses_a_threshold_it_cannot_know():
  config = sparse_dp.DPConfig("adafest", sigma1=2.0, sigma2=1.0)
  assert (config.threshold_sigmas, config.sigma_ratio) == (None, None)
  with pytest.raises(ValueError, match="with_adafest_defaults"):
    config.threshold_for(2.0)
  resolved = config.with_adafest_defaults([PCTR_ROWS], 2048)
  assert resolved.threshold_for(2.0) == pytest.approx(3.8443 * 2.0, abs=1e-3)
  assert resolved.sigma_ratio == 2.0  # sigma1 / sigma2 as given: what the run uses
  calibrated = sparse_dp.DPConfig("adafest", target_epsilon=1.0)
  assert calibrated.with_adafest_defaults([PCTR_ROWS], 2048).sigma_ratio == pytest.approx(
      2.081, abs=1e-3)
  absolute = sparse_dp.DPConfig("adafest", target_epsilon=1.0,
                                threshold=7.0).with_adafest_defaults([PCTR_ROWS], 2048)
  assert absolute.threshold_for(2.0) == 7.0
  assert absolute.threshold_sigmas is None  # unused under tau: not reported as if it were
  assert absolute.sigma_ratio == pytest.approx(2.081, abs=1e-3)  # the rule's t gives it
  dpsgd = sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0)
  assert dpsgd.with_adafest_defaults([PCTR_ROWS], 2048) is dpsgd
  for name in ("sigma_ratio", "threshold_sigmas"):
    with pytest.raises(ValueError, match=name):
      sparse_dp.DPConfig("adafest", target_epsilon=1.0, **{name: 0.0})


def _model():
  keras.utils.set_random_seed(0)
  user, item = keras.Input(shape=(), dtype=tf.int64), keras.Input(shape=(), dtype=tf.int64)
  tables = [Embedding(size, 4, name=name)(ids)
            for size, name, ids in ((300, "users", user), (50_000, "items", item))]
  model = keras.Model([user, item], keras.layers.Dense(1)(keras.layers.Concatenate()(tables)))
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model


@pytest.mark.parametrize("dense_tables, sparse_rows", [((), 50_300), (["users"], 50_000)])
def test_make_private_sets_them_from_the_sparse_tables_at_the_same_epsilon(dense_tables,
                                                                           sparse_rows):
  def private(**config):
    return sparse_dp.make_private(
        _model(), sparse_dp.DPConfig("adafest", target_epsilon=1.0, dense_tables=dense_tables,
                                     **config), num_examples=10_000, batch_size=512, epochs=1)

  rule = private()
  t = default_threshold_sigmas([sparse_rows], 512)
  spec, noise = rule.spec, rule.step_noise
  assert rule.config.threshold_sigmas == t
  assert spec.sigma1 / spec.sigma2 == pytest.approx(THRESHOLD_TIMES_RATIO / t)
  assert noise.threshold == pytest.approx(t * spec.sigma1 * rule.config.contribution_clip)
  # The epsilon spends sigma = (sigma1^-2 + sigma2^-2)^-1/2, whatever the split.
  fixed = private(sigma_ratio=5.0, threshold_sigmas=4.0).spec
  assert math.hypot(1 / spec.sigma1, 1 / spec.sigma2) == pytest.approx(
      math.hypot(1 / fixed.sigma1, 1 / fixed.sigma2), rel=1e-9)
  planned = sparse_dp.accounting.steps_for_epochs(1, 512 / 10_000)
  assert rule.epsilon(steps=planned) == pytest.approx(1.0, abs=0.01)
