"""The DP step allows only listed operations on state in the forward pass, and refuses the rest.

Each example's forward pass is read when the step is traced
(sparse_dp/training/dp_step/state_writes.py): an operation that is stateful or
takes a resource runs only if it reads a variable or lookup table, draws a fixed
number of random values, or is control flow. A raw training op on a
non-trainable weight, a ``tf.random.Generator`` (its state is saved with the
model and the per-example map advances it once per example) and a draw whose
size comes from the data are refused, each naming the operation, the layer's
name scope and the fix.
"""

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp import keras
from sparse_dp.layers import Embedding
from sparse_dp.mechanisms.rows.padding import ordinary_slices
from sparse_dp.training.dp_step import dense_layers
from sparse_dp.training.dp_step.losses import per_example_loss_fn
from sparse_dp.training.dp_step.state_writes import StateWriteError
from sparse_dp.training.dp_step.step import StepNoise, private_gradients

VOCAB, B, L = 20, 4, 3
NO_NOISE = StepNoise(gradient_multiplier=0.0, contribution_multiplier=None, l2_norm_clip=1.0,
                     contribution_clip=1.0, threshold=0.0, expected_batch_size=float(B))


def step(model, data):
  """One DP step's gradients of ``model`` on ``data`` (traced, as ``fit`` traces it)."""
  leaves = dense_layers.trainable_leaf_layers(model)
  gradients, _, _ = tf.function(lambda data: private_gradients(
      leaves, per_example_loss_fn(model), data, NO_NOISE, tf.constant([1, 2], tf.int64)))(data)
  return gradients


def batch():
  rng = np.random.default_rng(0)
  return (tf.constant(rng.integers(1, VOCAB, (B, L)), tf.int64),
          tf.constant(rng.integers(0, 2, (B, 1)), tf.float32))


def model_with(layer):
  """Embedding -> ``layer`` -> Dense(1), compiled for a per-example binary loss."""
  ids = keras.Input(shape=(L,), dtype=tf.int64)
  hidden = layer(Embedding(VOCAB, 4, combiner="sum")(ids))
  model = keras.Model(ids, keras.layers.Dense(1)(hidden))
  model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model


class TrainsItsStatistic(keras.layers.Layer):
  """Moves a non-trainable mean towards the batch's by a raw training op (not an assign)."""

  def build(self, input_shape):
    self.mean = self.add_weight(name="mean", shape=input_shape[1:], trainable=False,
                                initializer="zeros")

  def call(self, h):
    tf.raw_ops.ResourceApplyGradientDescent(var=self.mean.handle, alpha=1.0,
                                            delta=self.mean - tf.reduce_mean(h, 0))
    return h


class GeneratorNoise(keras.layers.Layer):
  """Adds noise from a ``tf.random.Generator`` it holds (its state is saved with the model)."""

  def __init__(self, skip_by_data=False, **kwargs):
    super().__init__(**kwargs)
    self.skip_by_data = skip_by_data
    self.rng = tf.random.Generator.from_seed(1)

  def call(self, h):
    if self.skip_by_data:
      self.rng.skip(tf.cast(tf.reduce_sum(tf.abs(h)) * 100.0, tf.int64))
      return h
    return h + self.rng.normal(tf.shape(h))


class DataSizedDraw(keras.layers.Layer):
  """Draws as many random values as the example's (rounded) activation sum."""

  def call(self, h):
    count = tf.cast(tf.reduce_sum(tf.abs(h)) * 100.0, tf.int32) + 1
    return h + tf.reduce_mean(tf.random.uniform([count]))


@pytest.mark.parametrize("layer, op, fix", [
    (lambda: TrainsItsStatistic(name="trains_mean"), "ResourceApplyGradientDescent",
     "not on the allow-list.*remove it from the model's call"),
    (lambda: GeneratorNoise(name="generator_noise"), "StatefulStandardNormalV2|RngReadAndSkip",
     "tf.random.Generator.*batch's size.*tf.random.stateless_"),
    (lambda: GeneratorNoise(skip_by_data=True, name="generator_skip"), "RngSkip|RngReadAndSkip",
     "tf.random.Generator.*tf.random.stateless_"),
    (lambda: DataSizedDraw(name="sized_by_data"), "RandomUniform",
     "not a constant of the graph.*draw a fixed shape"),
])
def test_an_operation_on_state_off_the_allow_list_is_refused_naming_it_and_the_fix(layer, op,
                                                                                  fix):
  made = layer()
  with pytest.raises(StateWriteError, match=f"'[^']*{made.name}[^']*' \\(({op})\\): .*{fix}"):
    step(model_with(made), batch())


class HashTableInCall(keras.layers.Layer):
  """Builds a hash table from the batch's ids inside ``call`` (initialised in the step)."""

  def call(self, h):
    keys = tf.cast(tf.round(h[0] * 10.0), tf.int64)
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(keys, tf.range(tf.size(keys, tf.int64))), -1)
    return h + tf.cast(table.size(), tf.float32)


def test_a_lookup_table_built_in_the_forward_pass_is_refused():
  with pytest.raises(StateWriteError,
                     match="in_call.*(HashTableV2|InitializeTableV2|LookupTableImportV2)"):
    step(model_with(HashTableInCall(name="in_call")), batch())


class PublicNoise(keras.layers.Layer):
  """Noise of a fixed shape: a stateless draw from a configured seed and a legacy draw."""

  def call(self, h):
    fixed = tf.random.stateless_normal([4], seed=[7, 11])
    return h + 0.1 * fixed + 0.1 * tf.random.normal(tf.shape(h))


def test_reads_dropout_and_fixed_size_draws_are_allowed():
  keras.utils.set_random_seed(2)
  ids = keras.Input(shape=(L,), dtype=tf.int64)
  hidden = keras.layers.Dense(6, activation="relu")(Embedding(VOCAB, 4, combiner="mean")(ids))
  hidden = keras.layers.GaussianNoise(0.1)(keras.layers.Dropout(0.5)(hidden))
  model = keras.Model(ids, keras.layers.Dense(1)(PublicNoise()(keras.layers.Dense(4)(hidden))))
  model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  gradients = step(model, batch())
  assert len(gradients) == len(model.trainable_weights)
  assert all(np.all(np.isfinite(tf.convert_to_tensor(ordinary_slices(g))))
             for g in gradients.values())
