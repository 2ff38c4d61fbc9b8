"""Swing distillation (Li et al., 2022): Eq. 5-6 temperatures, Eq. 8 noise, sizes, exposure."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from sparse_dp.jobs.distill.swing import metrics as swing_metrics
from sparse_dp.jobs.distill.swing.model import NextItemModelSpec
from sparse_dp.jobs.distill.swing.swing_data import Canaries, MarkovItemChain
from sparse_dp.jobs.distill.swing.temperature import SwingTargets, as_distribution, clue_distance

from support.stacks import ALPHA

CLUES = (7, 9)


def test_dynamic_temperature_is_t_plus_beta_over_distance_to_the_closest_clue():
  histories = tf.constant([[7, 1, 2, 3],   # clue at j=0: d = 4
                           [1, 2, 3, 9],   # j=3: d = 1
                           [9, 1, 7, 2],   # two clues, the closer (j=2) counts: d = 2
                           [1, 2, 3, 4]],  # none: T
                          tf.int64)
  np.testing.assert_array_equal(clue_distance(histories, CLUES), [4, 1, 2, np.inf])
  swing = SwingTargets(temperature=2.0, protection=6.0, top_k=3, noise_scale=0.0,
                       clue_items=CLUES)
  np.testing.assert_allclose(swing.temperatures(histories), [3.5, 8.0, 5.0, 2.0])
  logits = tf.random.stateless_normal([4, 11], [1, 2]) * 3
  expected = tf.nn.softmax(logits / np.array([3.5, 8.0, 5.0, 2.0], np.float32)[:, None])
  np.testing.assert_allclose(swing(logits, histories, tf.constant([0, 0], tf.int64)),
                             expected, rtol=1e-6)
  kd = SwingTargets.plain_kd(2.0)
  np.testing.assert_allclose(kd(logits, histories, tf.constant([0, 0], tf.int64)),
                             tf.nn.softmax(logits / 2.0), rtol=1e-6)


def test_target_protection_adds_laplace_noise_to_the_top_k_only(seed):
  """Kolmogorov-Smirnov at false-failure probability ALPHA (1e-6 for a random seed)."""
  rows, items, k, scale = 20000, 12, 3, 0.2
  soft_targets = tf.nn.softmax(tf.random.stateless_normal([rows, items], [3, 4]) * 2, axis=-1)
  protected = SwingTargets(2.0, 0.0, k, scale).protect(soft_targets, seed).numpy()
  difference = protected - soft_targets.numpy()
  top = np.argsort(-soft_targets.numpy(), axis=1)[:, :k]
  in_top = np.zeros_like(difference, bool)
  np.put_along_axis(in_top, top, True, axis=1)
  assert np.all(difference[~in_top] == 0), "Eq. 8: the other classes remain unchanged"
  noise = difference[in_top]
  assert stats.kstest(noise, "laplace", args=(0, scale)).pvalue > ALPHA
  # The test has power: a scale 20% off is rejected.
  assert stats.kstest(noise, "laplace", args=(0, 1.2 * scale)).pvalue < ALPHA
  assert stats.kstest(noise, "laplace", args=(0, scale / 1.2)).pvalue < ALPHA
  # Independent draws across the K positions of a row.
  by_position = noise.reshape(rows, k)
  assert abs(stats.pearsonr(by_position[:, 0], by_position[:, 1])[0]) < 0.05
  targets = as_distribution(tf.constant(protected)).numpy()
  assert np.all(targets >= 0)
  np.testing.assert_allclose(targets.sum(axis=1), 1.0, rtol=1e-6)


def test_bad_swing_settings_are_refused():
  with pytest.raises(ValueError, match="temperature"):
    SwingTargets(0.0, 1.0, 3, 0.1)
  with pytest.raises(ValueError, match="noise scale"):
    SwingTargets(2.0, 1.0, 3, -0.1)


def test_student_is_smaller_by_the_stated_ratio():
  teacher = NextItemModelSpec(num_items=300, history_length=4, embedding_dim=32, hidden_units=64)
  student = NextItemModelSpec(300, 4, embedding_dim=8, hidden_units=16, hash_buckets=50)
  assert teacher.trainable_parameters() == 300 * 32 + 4 * 32 * 64 + 64 + 64 * 300 + 300
  assert student.trainable_parameters() == 50 * 8 + 4 * 8 * 16 + 16 + 16 * 300 + 300
  teacher_model, student_model = teacher.build("teacher", 0), student.build("student", 0)
  for spec, model in ((teacher, teacher_model), (student, student_model)):
    assert sum(np.prod(w.shape) for w in model.trainable_weights) == spec.trainable_parameters()
  ids = tf.constant([[0, 299, 5, 17]], tf.int64)
  assert student_model(ids).shape == teacher_model(ids).shape == (1, 300)


def test_exposure_on_constructed_rankings():
  probabilities = np.array([[0.1, 0.6, 0.2, 0.1],    # secret 1 ranked first
                            [0.4, 0.3, 0.2, 0.1],    # secret 3 ranked last
                            [0.25, 0.25, 0.25, 0.25]])  # a tie counts for the secret
  secrets = np.array([1, 3, 2])
  ranks, bits = swing_metrics.canary_exposures(probabilities, secrets)
  np.testing.assert_array_equal(ranks, [1, 4, 1])
  np.testing.assert_allclose(bits, [2.0, 0.0, 2.0])
  summary = swing_metrics.exposure_summary(ranks, bits, np.array([True, True, False]))
  assert summary["max_exposure"] == 2.0 and summary["clued"]["mean_exposure"] == 1.0
  assert summary["unclued"]["median_rank"] == 1.0
  assert swing_metrics.top_k_accuracy(probabilities, secrets, 1) == pytest.approx(2 / 3)
  difference = swing_metrics.paired_difference(bits, np.array([1.0, 0.0, 0.0]))
  assert difference["mean"] == pytest.approx(1.0)
  assert difference["standard_error"] == pytest.approx(np.std([1, 0, 2], ddof=1) / np.sqrt(3))
  with pytest.raises(ValueError, match="item ids"):
    swing_metrics.ranks_of(probabilities, np.array([0, 1, 4]))


def test_canaries_are_clued_only_where_stated():
  rng = np.random.default_rng(3)
  chain = MarkovItemChain.generate(200, 5, 1.0, rng)
  clues = chain.clue_items(4, rng)
  canaries = Canaries.generate(30, 5, 200, clues, rng)
  assert np.all(np.isin(canaries.histories[canaries.clued, -1], clues))
  assert not np.isin(canaries.histories[canaries.clued, :-1], clues).any()
  assert not np.isin(canaries.histories[~canaries.clued], clues).any()
  assert canaries.clued.sum() == 15
  examples = chain.sample(500, 5, rng)
  successors = chain.successors[examples.histories[:, -1]]
  assert np.all(np.any(successors == examples.next_items[:, None], axis=1))
