"""The model validator refuses models whose examples are not separable, and passes the others."""

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding
from sparse_dp.training.checks.probe_noise import fixed_noise
from sparse_dp.training.checks.validation import ModelValidationError, check_model, check_separable
from sparse_dp.training.dp_step import dense_layers
from sparse_dp.training.dp_step.losses import per_example_loss_fn
from sparse_dp.training.dp_step.step import StepNoise, private_gradients

from support.keras_models import (
  VOCAB,
  InBatchRetrieval,
  PublicNegativesRetrieval,
  SubclassedModel,
  TwoTowers,
  functional_model,
  small_vocabulary_batch,
  synthetic_data,
)
from support.tfrs_models import RankingModel

B, L, FEATURES = 32, 3, 4


def compiled(model, loss=None):
  model.compile(optimizer="sgd",
                loss=loss or keras.losses.BinaryCrossentropy(from_logits=True))
  return model


def probe(model, data):
  losses_of = per_example_loss_fn(model)
  leaves = dense_layers.trainable_leaf_layers(model)
  return check_separable(model, leaves, losses_of, data)


def id_batch(rows=B, seed=0):
  rng = np.random.default_rng(seed)
  return (tf.constant(rng.integers(0, VOCAB, (rows, L)), tf.int64),
          tf.constant(rng.integers(0, 2, (rows, 1)), tf.float32))


def dense_batch(rows=B, seed=0):
  rng = np.random.default_rng(seed)
  return (tf.constant(rng.normal(size=(rows, FEATURES)), tf.float32),
          tf.constant(rng.integers(0, 2, (rows, 1)), tf.float32))


def over_ids(*middle, name="table"):
  """ids [B, L] -> Embedding -> Dense -> middle layers -> Dense(1)."""
  keras.utils.set_random_seed(3)
  ids = keras.Input(shape=(L,), dtype=tf.int64)
  hidden = keras.layers.Dense(6, activation="relu", name="hidden")(
      Embedding(VOCAB, 4, name=name)(ids))
  for layer in middle:
    hidden = layer(hidden)
  return compiled(keras.Model(ids, keras.layers.Dense(1, name="logit")(hidden)))


def centre(name):
  return keras.layers.Lambda(lambda h: h - tf.reduce_mean(h, axis=0), name=name)


def dense_features_model(centred=True):
  """Dense features -> Dense -> Dense(1), centred over the batch before the first Dense."""
  keras.utils.set_random_seed(3)
  features = keras.Input(shape=(FEATURES,))
  inputs = centre("centre_inputs")(features) if centred else features
  hidden = keras.layers.Dense(6, activation="relu")(inputs)
  return compiled(keras.Model(features, keras.layers.Dense(1)(hidden)))


def reversed_ids_model(*middle):
  """Example i looks up example B-1-i's ids: per-row gradients look right, the data does not."""
  keras.utils.set_random_seed(3)
  ids = keras.Input(shape=(L,), dtype=tf.int64)
  swapped = keras.layers.Lambda(lambda t: tf.reverse(t, [0]), name="swap_examples")(ids)
  hidden = keras.layers.Dense(6, activation="relu")(Embedding(VOCAB, 4)(swapped))
  for layer in middle:
    hidden = layer(hidden)
  return compiled(keras.Model(ids, keras.layers.Dense(1)(hidden)))


class SharedCandidates(keras.Model):
  """Scores each example against a constant set of candidate ids looked up once."""

  def __init__(self):
    super().__init__()
    self.table = Embedding(VOCAB, 4, name="candidates")
    self.project = keras.layers.Dense(4, name="project")

  def call(self, ids):
    query = self.table(ids[:, 0])
    candidates = self.project(self.table(tf.range(5, dtype=tf.int64)))  # [5, 4], not per example
    return tf.reduce_logsumexp(query @ tf.transpose(candidates), axis=1, keepdims=True)


def reshaped_ids_model():
  keras.utils.set_random_seed(3)
  ids = keras.Input(shape=(L,), dtype=tf.int64)
  flat = keras.layers.Lambda(lambda t: tf.reshape(t, [-1]), name="flatten_ids")(ids)
  vectors = Embedding(VOCAB, 4, name="flattened")(flat)
  per_example = keras.layers.Lambda(lambda v: tf.reshape(v, [-1, L * 4]))(vectors)
  return compiled(keras.Model(ids, keras.layers.Dense(1)(per_example)))


def centred_loss(y, logits):
  """Binary cross-entropy minus the batch's mean: not a per-example loss."""
  losses = keras.losses.binary_crossentropy(y, logits, from_logits=True)
  return losses - tf.reduce_mean(losses)


class RunningMean(keras.layers.Layer):
  """Keeps a running mean of its inputs in a non-trainable variable (as BatchNormalization does)."""

  def build(self, input_shape):
    self.mean = self.add_weight(name="mean", shape=input_shape[1:], trainable=False,
                                initializer="zeros")

  def call(self, h, training=False):
    if training:
      self.mean.assign(0.9 * self.mean + 0.1 * tf.reduce_mean(h, axis=0))
    return h


def positives_scaled_loss(y, logits):
  """Binary cross-entropy over the batch's number of positives (counted without a gradient)."""
  positives = tf.reduce_sum(tf.cast(y > 0.5, tf.float32))
  losses = keras.losses.binary_crossentropy(y, logits, from_logits=True)
  return losses / tf.maximum(positives, 1.0)


def class_balanced_loss(y, logits):
  """Binary cross-entropy with class weights set by each class's share of the batch."""
  positive = tf.cast(y[:, 0] > 0.5, tf.float32)
  share = tf.clip_by_value(tf.reduce_mean(positive), 0.05, 0.95)
  weights = positive / share + (1.0 - positive) / (1.0 - share)
  return keras.losses.binary_crossentropy(y, logits, from_logits=True) * weights


class Statistics(tf.Module):
  """Holds a running mean outside Keras's own weight lists."""

  def __init__(self, width):
    super().__init__()
    self.mean = tf.Variable(tf.zeros([width]), trainable=False, name="mean")


class ModuleRunningMean(keras.layers.Layer):
  """Keeps a running mean of its inputs in a tf.Module attribute (or one inside a list)."""

  def __init__(self, in_list=False, **kwargs):
    super().__init__(**kwargs)
    self.in_list = in_list

  def build(self, input_shape):
    statistics = Statistics(input_shape[-1])
    if self.in_list:
      self.history = [statistics]
    else:
      self.statistics = statistics

  def call(self, h, training=False):
    statistics = self.history[0] if self.in_list else self.statistics
    if training:
      statistics.mean.assign(0.9 * statistics.mean + 0.1 * tf.reduce_mean(h, axis=0))
    return h


def randomised(h):
  return h + tf.random.normal(tf.shape(h), stddev=0.1)


class HandWrittenInBatchSoftmax(TwoTowers):
  """The in-batch softmax written out in compute_loss, without tfrs.tasks.Retrieval."""

  def compute_loss(self, features, training=False):
    users, items = features
    logits = tf.matmul(self.query_tower(users), self.item_tower(items), transpose_b=True)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(tf.range(tf.shape(logits)[0]), logits)


def built(model, batch):
  """A compiled TFRS model whose layers are built by one loss computation."""
  model.compile(optimizer="sgd")
  model.compute_loss(batch)
  return model


def retrieval_batch(rows=B):
  rng = np.random.default_rng(5)
  return (tf.constant(rng.integers(0, VOCAB, rows), tf.int64),
          tf.constant(rng.integers(0, VOCAB, rows), tf.int64))


# Static refusals.


@pytest.mark.parametrize("make, name", [
    (lambda: over_ids(keras.layers.BatchNormalization(center=False, scale=False, name="bn")),
     "'bn' (BatchNormalization)"),
    (lambda: over_ids(keras.layers.experimental.SyncBatchNormalization(name="sync")),
     "'sync' (SyncBatchNormalization)"),
    (lambda: over_ids(keras.layers.Dense(6, activity_regularizer="l2", name="act")),
     "'act' (Dense) has an activity_regularizer"),
    (InBatchRetrieval, "'in_batch' (Retrieval)"),
])
def test_check_model_refuses_by_name_with_the_fix(make, name):
  with pytest.raises(ModelValidationError, match=name.replace("(", r"\(").replace(")", r"\)")) as e:
    check_model(make())
  assert "public" in str(e.value) or "remove it" in str(e.value)


def test_check_model_passes_frozen_batch_normalization_and_nested_models():
  frozen = keras.layers.BatchNormalization(name="frozen")
  frozen.trainable = False
  check_model(over_ids(frozen))
  inner = over_ids(keras.layers.BatchNormalization(name="deep"))
  outer = keras.Sequential([inner])
  with pytest.raises(ModelValidationError, match="'deep'"):
    check_model(outer)


# The probe refuses coupling models, naming the culprit.


@pytest.mark.parametrize("make, data, name", [
    (lambda: over_ids(keras.layers.BatchNormalization(center=False, scale=False, name="bn")),
     id_batch, "moving_mean.*'bn'"),
    (lambda: over_ids(centre("centre_hidden")), id_batch, "'centre_hidden'"),
    (dense_features_model, dense_batch, "'centre_inputs'"),
    (lambda: compiled(over_ids(), centred_loss), id_batch, "the loss 'centred_loss'"),
    (lambda: over_ids(RunningMean(name="running")), id_batch, "running/mean.*'running'"),
    (reshaped_ids_model, id_batch, "'flattened'.*'flatten_ids'"),
    (lambda: compiled(SharedCandidates()), small_vocabulary_batch, "'candidates'.*shared ids"),
    (reversed_ids_model, id_batch, "'swap_examples'.*removing one example"),
    (lambda: reversed_ids_model(keras.layers.Dropout(0.5)), id_batch,
     "'swap_examples'.*removing one example"),  # random forward pass: layer by layer
])
def test_probe_refuses_models_that_mix_examples(make, data, name):
  model = make()
  with pytest.raises(ModelValidationError, match=name):
    probe(model, data())


@pytest.mark.parametrize("loss", [positives_scaled_loss, class_balanced_loss])
@pytest.mark.parametrize("random_layer", [
    lambda: keras.layers.Dropout(0.3), lambda: keras.layers.GaussianNoise(0.5),
    lambda: keras.layers.AlphaDropout(0.2), lambda: keras.layers.GaussianDropout(0.2)])
def test_probe_refuses_batch_coupled_losses_in_random_models(loss, random_layer):
  """Random layers get fixed per-example noise, so the removal test of whole passes runs."""
  model = compiled(over_ids(random_layer(), keras.layers.Dense(6)), loss)
  with pytest.raises(ModelValidationError, match=f"the loss '{loss.__name__}'.*removing one"):
    probe(model, id_batch())


def test_fixed_noise_follows_each_example_across_passes():
  dropout = keras.layers.Dropout(0.5)
  model = keras.Sequential([dropout])
  model.build((None, 64))
  original, x = dropout._random_generator, tf.ones([5, 64])
  with fixed_noise(model) as passes:
    with passes.over([0, 1, 2, 3, 4]):
      full = dropout(x, training=True)
    with passes.over([0, 2, 3, 4]):
      without_one = dropout(tf.gather(x, [0, 2, 3, 4]), training=True)
  np.testing.assert_array_equal(without_one, tf.gather(full, [0, 2, 3, 4]))
  assert not np.array_equal(full[0], full[2])  # each example draws its own mask
  assert dropout._random_generator is original


def test_probe_refuses_randomness_outside_random_layers_with_the_fix():
  model = over_ids(keras.layers.Lambda(randomised, name="noisy"))
  with pytest.raises(ModelValidationError, match="outside a Keras random layer.*BaseRandomLayer"):
    probe(model, id_batch())


@pytest.mark.parametrize("in_list", [False, True])
def test_probe_refuses_state_held_on_a_module_attribute(in_list):
  model = over_ids(ModuleRunningMean(in_list, name="running"))
  holder = model.get_layer("running")
  statistics = holder.history[0] if in_list else holder.statistics
  with pytest.raises(ModelValidationError, match=r"'running' \(ModuleRunningMean\)"):
    probe(model, id_batch())
  np.testing.assert_array_equal(statistics.mean.numpy(), 0.0)  # restored


@pytest.mark.parametrize("make", [InBatchRetrieval, HandWrittenInBatchSoftmax])
def test_probe_catches_in_batch_softmax(make):
  model = built(make(), retrieval_batch())
  with pytest.raises(ModelValidationError, match="mixes examples"):
    probe(model, retrieval_batch())


def test_probe_restores_the_state_it_refuses():
  model = over_ids(keras.layers.BatchNormalization(center=False, scale=False, name="bn"))
  before = [v.numpy() for v in model.non_trainable_variables]
  with pytest.raises(ModelValidationError, match="without noise"):
    probe(model, id_batch())
  for a, b in zip(before, model.non_trainable_variables):
    np.testing.assert_array_equal(a, b.numpy())


# Separable models pass.


class DictFeatures(keras.Model):
  """Ragged, sparse and dense features in a dict, with dropout in training mode."""

  def __init__(self):
    super().__init__()
    self.tags = Embedding(VOCAB, 4, name="tags")
    self.words = Embedding(VOCAB, 4, combiner="mean", name="words")
    self.hidden = keras.layers.Dense(8, activation="relu")
    self.dropout = keras.layers.Dropout(0.5)
    self.logit = keras.layers.Dense(1)

  def call(self, features, training=False):
    joined = tf.concat([self.tags(features["tags"]), self.words(features["words"]),
                        features["price"]], axis=1)
    return self.logit(self.dropout(self.hidden(joined), training=training))


def dict_batch(rows=B):
  rng = np.random.default_rng(2)
  tags = tf.ragged.constant([rng.integers(0, VOCAB, rng.integers(0, 4)).tolist()
                             for _ in range(rows)], tf.int64)
  words = tf.ragged.constant([rng.integers(0, VOCAB, rng.integers(1, 3)).tolist()
                              for _ in range(rows)], tf.int64).to_sparse()
  price = tf.constant(rng.normal(size=(rows, 1)), tf.float32)
  labels = tf.constant(rng.integers(0, 2, (rows, 1)), tf.float32)
  weights = tf.constant(rng.uniform(size=rows), tf.float32)
  return {"tags": tags, "words": words, "price": price}, labels, weights


def with_dropout():
  return over_ids(keras.layers.Dropout(0.3), keras.layers.Dense(6, activation="relu"))


def with_noise_and_per_example_normalisation():
  frozen = keras.layers.BatchNormalization(center=False, scale=False)
  frozen.trainable = False  # inference mode: a fixed map of each example
  return over_ids(keras.layers.GaussianNoise(0.5), frozen,
                  keras.layers.LayerNormalization(center=False, scale=False))


def ranking():
  return built(RankingModel(keras.losses.Reduction.NONE), ids_and_labels())


def public_negatives():
  return built(PublicNegativesRetrieval(), retrieval_batch())


def subclassed():
  return compiled(SubclassedModel())


def ids_and_labels():
  ids, labels = synthetic_data()
  return tf.constant(ids[:B]), tf.constant(labels[:B])


@pytest.mark.parametrize("make, data", [
    (functional_model, ids_and_labels), (subclassed, ids_and_labels), (with_dropout, id_batch),
    (lambda: over_ids(keras.layers.Dropout(0.5, noise_shape=(1, 6))), id_batch),
    (lambda: over_ids(keras.layers.Dropout(0.3), keras.layers.AlphaDropout(0.2),
                      keras.layers.GaussianDropout(0.2)), id_batch),
    (with_noise_and_per_example_normalisation, id_batch),
    (lambda: compiled(DictFeatures()), dict_batch), (ranking, ids_and_labels),
    (public_negatives, retrieval_batch),
])
def test_separable_models_pass(make, data):
  model, batch = make(), data()
  per_example_loss_fn(model)(batch)  # builds a subclassed model as its first step would
  check_model(model)
  weights = [w.numpy() for w in model.weights]
  assert probe(model, batch)
  for a, b in zip(weights, model.weights):
    np.testing.assert_array_equal(a, b.numpy())


def test_a_batch_of_one_cannot_be_probed():
  assert not probe(over_ids(centre("centre_hidden")), id_batch(rows=1))


# The step computes each example's gradient alone
# (sparse_dp/training/dp_step/per_example.py), so even a model the probe refuses keeps the
# bound: one added example moves the clipped sum by <= C2.
# The probe refuses it because the model would not train as written (its batch statistic is
# taken over one example).


def clipped_sum_shift(model, data, extra):
  """``||G(D + z) - G(D)||`` with no noise and C2 = 1, over every weight."""
  leaves = dense_layers.trainable_leaf_layers(model)
  noise = StepNoise(gradient_multiplier=0.0, contribution_multiplier=None, l2_norm_clip=1.0,
                    contribution_clip=1.0, threshold=0.0, expected_batch_size=1.0)

  def clipped(batch):
    gradients, _, _ = private_gradients(leaves, per_example_loss_fn(model), batch, noise,
                                        tf.constant([1, 2], tf.int64))
    return {ref: tf.convert_to_tensor(g) for ref, g in gradients.items()}

  before = clipped(data)
  after = clipped(tuple(tf.concat([a, b], 0) for a, b in zip(data, extra)))
  return float(tf.sqrt(sum(tf.reduce_sum(tf.square(after[r] - before[r])) for r in before)))


def test_the_step_keeps_the_sensitivity_bound_for_refused_and_accepted_models():
  data = dense_batch()
  outlier = (tf.fill([1, FEATURES], 100.0), tf.ones([1, 1]))
  coupled, separable = dense_features_model(centred=True), dense_features_model(centred=False)
  assert clipped_sum_shift(coupled, data, outlier) <= 1.0 + 1e-5  # C2 = 1
  assert clipped_sum_shift(separable, data, outlier) <= 1.0 + 1e-5


# Through the public API: make_private refuses statically, fit probes its first batch.


def private(model, examples):
  return sparse_dp.make_private(
      model, sparse_dp.DPConfig("dpsgd", noise_seed=1, noise_multiplier=1.0),
      num_examples=examples, batch_size=64)


@pytest.mark.parametrize("make, name", [
    (lambda: over_ids(keras.layers.BatchNormalization(center=False, scale=False, name="bn")),
     "'bn'"),
    (lambda: built(InBatchRetrieval(), retrieval_batch()), "'in_batch'"),
])
def test_make_private_refuses_known_coupling_layers(make, name):
  with pytest.raises(ModelValidationError, match=name):
    private(make(), 512)


@pytest.mark.parametrize("make, data, name", [
    (lambda: over_ids(centre("centre_hidden")), id_batch, "'centre_hidden'"),
    (dense_features_model, dense_batch, "'centre_inputs'"),
    (lambda: compiled(over_ids(), centred_loss), id_batch, "'centred_loss'"),
    (reshaped_ids_model, id_batch, "'flattened'"),
    (reversed_ids_model, id_batch, "'swap_examples'"),
    (lambda: built(HandWrittenInBatchSoftmax(), retrieval_batch()), retrieval_batch,
     "hand_written_in_batch_softmax"),
    (lambda: compiled(over_ids(keras.layers.Dropout(0.3), keras.layers.Dense(6)),
                      positives_scaled_loss), id_batch, "the loss 'positives_scaled_loss'"),
    (lambda: over_ids(ModuleRunningMean(name="running")), id_batch, "'running'"),
])
def test_fit_refuses_models_that_mix_examples_before_any_step(make, data, name):
  model = make()
  x, y = data(rows=512)
  training = private(model, 512)
  weights = [w.numpy() for w in model.trainable_weights]
  with pytest.raises(ModelValidationError, match=name):
    model.fit(training.poisson_dataset(x, y), verbose=0)
  assert training.accountant.steps == 0
  for a, b in zip(weights, model.trainable_weights):
    np.testing.assert_array_equal(a, b.numpy())


def test_public_negatives_retrieval_trains_privately():
  model = built(PublicNegativesRetrieval(), retrieval_batch())
  users, items = retrieval_batch(rows=512)
  training = private(model, 512)
  model.fit(training.poisson_dataset(users, items), verbose=0)
  assert training.accountant.steps > 0 and 0 < training.epsilon() < float("inf")


class ModuleHeldScale(keras.layers.Layer):
  """A trainable variable held through a tf.Module: Keras trains it, the DP step could not."""

  def build(self, input_shape):
    self.held = tf.Module()
    self.held.scale = tf.Variable(tf.ones([input_shape[-1]]), name="held_scale")

  def call(self, h):
    return h * self.held.scale


def test_a_trainable_variable_outside_dense_and_embedding_weights_is_refused_by_name():
  model = over_ids(ModuleHeldScale(name="scaled"))
  assert any("held_scale" in v.name for v in model.trainable_variables)
  with pytest.raises(sparse_dp.training.UnsupportedLayerError, match="held_scale"):
    sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", target_epsilon=1.0),
                           num_examples=1000, batch_size=B)
