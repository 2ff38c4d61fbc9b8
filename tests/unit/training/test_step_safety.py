"""What the DP step refuses, what it logs, and the penalties it adds after the noise."""

import functools
import types

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp import keras
from sparse_dp.layers import Embedding
from sparse_dp.training.dp_step import dense_layers
from sparse_dp.training.dp_step.losses import per_example_loss_fn
from sparse_dp.training.dp_step.penalties import (
  DataDependentLossError,
  add_penalty_gradients,
  penalty_of,
)
from sparse_dp.training.dp_step.step import StepNoise, private_gradients

from support.keras_models import small_vocabulary_batch

VOCAB, B, L = 40, 8, 3
ADAFEST = StepNoise(gradient_multiplier=0.7, contribution_multiplier=1.0, l2_norm_clip=1.0,
                    contribution_clip=1.0, threshold=2.0, expected_batch_size=float(B))


def compiled(model):
  model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model


def step(model, data, noise=ADAFEST, debug_metrics=False):
  leaves = dense_layers.trainable_leaf_layers(model)
  return tf.function(lambda data: private_gradients(
      leaves, per_example_loss_fn(model), data, noise, tf.constant([3, 4], tf.int64),
      debug_metrics=debug_metrics))(data)


def batch(rows=B):
  return small_vocabulary_batch(rows, VOCAB, L)


def pctr_like(**dense_kwargs):
  keras.utils.set_random_seed(2)
  ids = keras.Input(shape=(L,), dtype=tf.int64)
  hidden = keras.layers.Dense(6, activation="relu", name="hidden", **dense_kwargs)(
      Embedding(VOCAB, 4, name="table")(ids))
  return compiled(keras.Model(ids, keras.layers.Dense(1, name="logit")(hidden)))


@functools.lru_cache(maxsize=None)
def _traced_step(noise, debug_metrics):
  """``step`` of ``pctr_like()`` at ``noise``, one trace for batches of any size (as a Poisson
  batch's in ``fit``), and the names of the variables its gradients are keyed by."""
  model = pctr_like()
  leaves = dense_layers.trainable_leaf_layers(model)
  spec = (tf.TensorSpec([None, L], tf.int64), tf.TensorSpec([None, 1], tf.float32))
  traced = tf.function(lambda data: private_gradients(
      leaves, per_example_loss_fn(model), data, noise, tf.constant([3, 4], tf.int64),
      debug_metrics=debug_metrics), input_signature=[spec])
  return traced, {v.ref(): v.name for v in model.trainable_variables}


@functools.lru_cache(maxsize=None)
def pctr_step(noise=ADAFEST, rows=B, debug_metrics=False):
  """``step(pctr_like(), batch(rows), noise, debug_metrics)``, shared by the tests (one trace
  per ``noise``): the gradients by variable name, the losses and statistics (read-only)."""
  traced, names = _traced_step(noise, debug_metrics)
  gradients, losses, stats = traced(batch(rows))
  return (types.MappingProxyType({names[ref]: g for ref, g in gradients.items()}), losses,
          types.MappingProxyType(stats))


def test_logs_hold_only_dp_statistics_unless_debug():
  _, _, stats = pctr_step()
  assert set(stats) == {"nonzero_rows", "nonzero_coordinates", "gradient_size_reduction",
                        "noisy_gradient_norm"}
  _, _, debug = pctr_step(debug_metrics=True)
  assert {"gradient_snr", "rows_dropped", "false_positive_rows"} <= set(debug)


def test_noisy_gradient_norm_is_the_norm_of_the_update():
  gradients, _, stats = pctr_step()
  total = sum(float(tf.reduce_sum(tf.square(g.values if isinstance(g, tf.IndexedSlices) else g)))
              for g in gradients.values())
  assert float(stats["noisy_gradient_norm"]) == pytest.approx(np.sqrt(total), rel=1e-5)


def test_kernel_regularizer_is_added_after_the_noise():
  l2 = 0.3
  model = pctr_like(kernel_regularizer=keras.regularizers.L2(l2))
  data = batch()
  model(data[0])
  with_penalty = add_penalty_gradients(penalty_of(model), step(model, data)[0])
  without = pctr_step()[0]  # of pctr_like(): same seed, same weights, no penalty
  hidden = model.get_layer("hidden")
  expected = without[hidden.kernel.name] + 2 * l2 * hidden.kernel
  np.testing.assert_allclose(with_penalty[hidden.kernel.ref()], expected, rtol=1e-5, atol=1e-6)
  logit = model.get_layer("logit").kernel
  np.testing.assert_allclose(with_penalty[logit.ref()], without[logit.name], rtol=1e-6)


def test_penalty_on_a_table_is_refused():
  model = pctr_like()
  model(batch()[0])
  table = model.get_layer("table")
  model.add_loss(lambda: tf.reduce_sum(tf.square(table.embeddings)))
  with pytest.raises(ValueError, match="table"):
    penalty_of(model)


class AddsBatchLoss(keras.layers.Layer):
  def call(self, h):
    self.add_loss(tf.reduce_mean(h))  # a function of the whole batch
    return h


@pytest.mark.parametrize("layer", [AddsBatchLoss(name="batch_loss"),
                                   keras.layers.ActivityRegularization(l1=0.1,
                                                                          name="activity")])
def test_data_dependent_losses_are_refused_by_name(layer):
  ids = keras.Input(shape=(L,), dtype=tf.int64)
  hidden = layer(keras.layers.Dense(6)(Embedding(VOCAB, 4)(ids)))
  model = compiled(keras.Model(ids, keras.layers.Dense(1)(hidden)))
  with pytest.raises(DataDependentLossError, match=layer.name):
    step(model, batch())


@pytest.mark.parametrize("noise", [ADAFEST, StepNoise(0.7, None, 1.0, 1.0, 0.0, float(B))])
def test_an_empty_batch_gives_noise_only(noise):
  gradients, losses, stats = pctr_step(noise, rows=0)
  assert losses.shape == (0,)
  kernel = gradients["logit/kernel:0"]
  assert np.all(np.isfinite(kernel)) and np.any(kernel != 0)  # the noise, and nothing else
  assert np.isfinite(float(stats["noisy_gradient_norm"]))


def train_one_step(model, config):
  import sparse_dp
  x, y = batch(64)
  private = sparse_dp.make_private(model, config, num_examples=64, batch_size=64)
  model.fit(private.poisson_dataset(x, y, epochs=1), verbose=0)
  return private


def test_fit_applies_a_kernel_regularizer_with_zero_clipped_sum():
  """With C2 -> 0 and no noise the step's gradient is the penalty's alone: w -= lr 2 l2 w."""
  import sparse_dp
  model = pctr_like(kernel_regularizer=keras.regularizers.L2(0.5))
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  model(batch()[0])
  kernel = model.get_layer("hidden").kernel
  before = kernel.numpy()
  train_one_step(model, sparse_dp.DPConfig("dpsgd", noise_multiplier=1e-12, l2_norm_clip=1e-12,
                                           noise_seed=1))
  np.testing.assert_allclose(kernel.numpy(), before * (1 - 0.1 * 2 * 0.5), rtol=1e-5, atol=1e-7)


def test_a_threshold_below_the_noise_warns_with_the_fix():
  import sparse_dp
  keras.utils.set_random_seed(2)
  ids = keras.Input(shape=(), dtype=tf.int64)
  model = compiled(keras.Model(ids, keras.layers.Dense(1)(Embedding(1_000_000, 2)(ids))))
  config = sparse_dp.DPConfig("adafest", sigma1=10.0, sigma2=1.0, threshold=5.0)
  with pytest.warns(UserWarning, match="threshold_sigmas"):
    sparse_dp.make_private(model, config, num_examples=10_000, batch_size=100)
  assert config.threshold_for(10.0) == 5.0
  assert sparse_dp.DPConfig("adafest", sigma1=10.0, sigma2=1.0,
                            threshold_sigmas=4.0).threshold_for(10.0) == 40.0


class OwnStep(keras.Model):
  def __init__(self):
    super().__init__()
    self.table = Embedding(VOCAB, 2)
    self.logit = keras.layers.Dense(1)

  def call(self, ids):
    return self.logit(self.table(ids))

  def train_step(self, data):
    return super().train_step(data)


class OwnLoss(OwnStep):
  """A Keras compute_loss override: the DP step (which applies the compiled loss per example)
  would silently not call it."""

  train_step = keras.Model.train_step

  def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None):
    return tf.reduce_mean(tf.square(y - y_pred))


@pytest.mark.parametrize("make, message", [
    (OwnStep, "OwnStep defines its own train_step"),
    (OwnLoss, "OwnLoss overrides keras.Model.compute_loss.*compile\\(loss=")])
def test_a_model_with_its_own_train_step_or_compute_loss_is_refused(make, message):
  import sparse_dp
  model = compiled(make())
  model(batch()[0][:, 0])
  with pytest.raises(ValueError, match=message):
    sparse_dp.make_private(model, sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0),
                           num_examples=100, batch_size=10)
