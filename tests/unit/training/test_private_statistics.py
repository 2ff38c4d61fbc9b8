"""DP preprocessing statistics: their mechanisms' distributions and their epsilon in the run's."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import sparse_dp
from sparse_dp import keras, preprocessing
from sparse_dp.accounting import PrivacyAccountant
from sparse_dp.layers import Embedding

from support.stacks import ALPHA

N = 400
VALUES = np.random.default_rng(0).normal(1.0, 2.0, (N, 1))


def test_the_dp_mean_is_the_clipped_mean_plus_laplace_noise_of_the_stated_scale():
  low, high, epsilon = -3.0, 5.0, 0.5
  means = np.array([preprocessing.private_mean_variance(VALUES, low, high, epsilon, seed=s)
                    .layer.get_config()["mean"] for s in range(600)]).reshape(-1)
  clipped = np.clip(VALUES, low, high).mean()
  scale = 1 * max(abs(low), abs(high)) / (epsilon / 2) / N  # F = 1 feature
  assert stats.kstest(means - clipped, stats.laplace(scale=scale).cdf).pvalue > ALPHA


def exact_probabilities(values, p, grid, epsilon):
  scores = preprocessing.quantile_scores(values, p, grid, epsilon)
  weights = np.exp(scores - scores.max())
  return weights / weights.sum()


def test_quantile_choice_is_epsilon_dp_on_neighbouring_data_and_sampled_as_stated():
  grid, epsilon, p = np.linspace(-4, 6, 41), 1.0, 0.5
  values = VALUES.reshape(-1)
  for neighbour in (values[1:], np.append(values, 100.0), np.append(values, -100.0)):
    ratio = exact_probabilities(values, p, grid, epsilon) / exact_probabilities(
        neighbour, p, grid, epsilon)
    assert np.max(np.abs(np.log(ratio))) <= epsilon + 1e-9
  draws = [preprocessing.private_quantiles(values, [p], grid, epsilon, seed=s)
           .layer.bin_boundaries[0] for s in range(2000)]
  expected = exact_probabilities(values, p, grid, epsilon)
  observed = np.array([np.sum(np.isclose(draws, c)) for c in grid])
  keep = expected * len(draws) >= 5  # chi-square on the cells with mass
  rest = len(draws) - observed[keep].sum()
  chi = stats.chisquare(np.append(observed[keep], rest),
                        np.append(expected[keep], 1 - expected[keep].sum()) * len(draws))
  assert chi.pvalue > ALPHA


def test_a_dp_vocabulary_keeps_the_frequent_ids_at_a_large_epsilon():
  rng = np.random.default_rng(1)
  ids = np.concatenate([rng.integers(0, 5, 900), rng.integers(5, 1000, 100)])
  vocabulary = preprocessing.private_vocabulary(ids, 1000, k=5, epsilon=50.0, seed=3)
  assert sorted(vocabulary.layer.get_vocabulary()[1:]) == [0, 1, 2, 3, 4]


def test_their_epsilons_are_spent_once_and_composed_with_the_training_steps():
  norm = preprocessing.private_mean_variance(VALUES, -3, 5, 0.3, seed=1, name="norm")
  vocabulary = preprocessing.private_vocabulary(
      np.random.default_rng(2).integers(0, 50, N), 50, k=20, epsilon=0.2, seed=2, name="vocab")
  ids = keras.Input(shape=(), dtype=tf.int64)
  values = keras.Input(shape=(1,), dtype=tf.float32)
  looked = Embedding(vocabulary.layer.vocabulary_size(), 2)(vocabulary.layer(ids))
  model = keras.Model([ids, values], keras.layers.Dense(1)(
      keras.layers.Concatenate()([looked, norm.layer(values)])))
  model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  config = sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0, noise_seed=1)
  with pytest.raises(ValueError, match="'vocab'.*public_layers"):
    sparse_dp.make_private(model, config, num_examples=N, batch_size=40)
  private = sparse_dp.make_private(model, config, num_examples=N, batch_size=40,
                                   private_statistics=[norm, vocabulary])
  rng = np.random.default_rng(3)
  data = ((rng.integers(0, 50, N), VALUES.astype("float32")), rng.integers(0, 2, (N, 1)))
  model.fit(private.poisson_dataset(*data, epochs=0.3), verbose=0)
  steps = int(private.steps_taken.numpy())
  expected = PrivacyAccountant("pld").spend_pure(0.5).step(1.0, 40 / N, steps)
  assert private.epsilon() == pytest.approx(expected.get_epsilon(1 / N), rel=1e-6)
