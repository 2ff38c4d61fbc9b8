"""Models DP training refuses name the input and the fix.

Each case is a tiny model a recommender engineer would write; the refusal
comes before (or at) the first step and names what to change.
"""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_recommenders as tfrs

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding

from support.tiers import first_case_fast

VOCAB, N, BATCH = 20, 64, 16
IDS = np.arange(N) % VOCAB
LABELS = (np.arange(N) % 2).astype("float32")
BCE = keras.losses.BinaryCrossentropy(from_logits=True)


def _make_private(model):
  return sparse_dp.make_private(
      model, sparse_dp.DPConfig("dpsgd", noise_seed=1, noise_multiplier=1.0),
      num_examples=N, batch_size=BATCH)


def _fit(model, x=IDS, y=LABELS):
  _make_private(model)
  model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH), verbose=0)


def _functional(hidden, loss=BCE, ids_shape=(), optimizer=None):
  ids = keras.Input(shape=ids_shape, dtype=tf.int64)
  model = keras.Model(ids, hidden(ids))
  model.compile(optimizer=optimizer or keras.optimizers.legacy.SGD(0.1), loss=loss)
  return model


class _Ranking(tfrs.Model):
  """A TFRS ranking model whose task has reduction NONE, given labels of ``labels_shape``."""

  def __init__(self, labels_shape):
    super().__init__()
    self.labels_shape = labels_shape
    self.table = Embedding(VOCAB, 4)
    self.score = keras.layers.Dense(1)
    self.task = tfrs.tasks.Ranking(loss=keras.losses.BinaryCrossentropy(
        from_logits=True, reduction=keras.losses.Reduction.NONE))

  def call(self, ids):
    return self.score(self.table(ids))

  def compute_loss(self, features, training=False):
    ids, labels = features
    return self.task(labels=tf.reshape(labels, self.labels_shape), predictions=self(ids))


class _TwoTasks(tfrs.Model):
  """The multi-task route the loss_weights refusal names: a weighted per-example sum."""

  def __init__(self):
    super().__init__()
    self.table = Embedding(VOCAB, 4)
    self.click, self.rating = keras.layers.Dense(1), keras.layers.Dense(1)
    self.click_task, self.rating_task = (tfrs.tasks.Ranking(loss=loss) for loss in (
        keras.losses.BinaryCrossentropy(from_logits=True, reduction=keras.losses.Reduction.NONE),
        keras.losses.MeanSquaredError(reduction=keras.losses.Reduction.NONE)))

  def compute_loss(self, features, training=False):
    ids, labels = features
    hidden = self.table(ids)
    return (1.0 * self.click_task(labels=labels[:, None], predictions=self.click(hidden))
            + 0.5 * self.rating_task(labels=labels[:, None], predictions=self.rating(hidden)))


def _compiled(model: tfrs.Model) -> tfrs.Model:
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.1))
  model.compute_loss((IDS[:2], LABELS[:2]))  # builds it
  return model


def test_tfrs_ranking_with_labels_of_shape_batch_names_the_labels_shape():
  with pytest.raises(ValueError, match=r"already has reduction NONE.*labels.*\[batch, 1\]"):
    _fit(_compiled(_Ranking(labels_shape=[-1])))


class _PoppedLabels(tfrs.Model):
  """TFRS's ranking tutorial's way: ``compute_loss`` pops the labels from its features."""

  def __init__(self, label="rating"):
    super().__init__()
    self.label = label
    self.table = Embedding(VOCAB, 4)
    self.score = keras.layers.Dense(1)
    self.task = tfrs.tasks.Ranking(loss=keras.losses.MeanSquaredError(
        reduction=keras.losses.Reduction.NONE))

  def call(self, features):
    return self.score(self.table(features["ids"]))

  def compute_loss(self, features, training=False):
    labels = features.pop(self.label)
    return self.task(labels=labels[:, None], predictions=self(features))


def _fit_popping(model):
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.1))
  model({"ids": IDS[:2]})  # builds it
  private = _make_private(model)
  features = {"ids": IDS, "rating": LABELS}
  model.fit(private.poisson_dataset(features, epochs=0.5), verbose=0,
            callbacks=[private.callback()])
  return private


def test_a_compute_loss_that_pops_its_labels_trains_and_a_missing_one_is_named():
  assert int(_fit_popping(_PoppedLabels()).steps_taken.numpy()) == N // BATCH // 2
  with pytest.raises(ValueError, match=r"compute_loss reads the feature 'user_rating', which "
                                       r"the batch does not have \(its features: ids, rating\)"):
    _fit_popping(_PoppedLabels(label="user_rating"))


def test_loss_of_shape_one_is_refused_at_the_loss():
  def mean_squared(y, p):
    return tf.reshape(tf.reduce_mean(tf.square(y - p[:, 0])), [1])
  model = _functional(lambda ids: keras.layers.Dense(1)(Embedding(VOCAB, 4)(ids)),
                      loss=mean_squared)
  with pytest.raises(ValueError, match=r"'mean_squared' returned losses of shape \(1,\).*"
                                       r"shape \[batch\].*Reduction.NONE"):
    _fit(model)


def test_layer_normalization_names_its_weightless_form():
  model = _functional(lambda ids: keras.layers.Dense(1)(
      keras.layers.LayerNormalization()(Embedding(VOCAB, 4)(ids))))
  with pytest.raises(ValueError, match=r"'layer_normalization.*LayerNormalization\(center=False, "
                                       r"scale=False\)"):
    _make_private(model)


def test_a_float16_layer_is_not_taken_for_mixing_examples_and_trains():
  # The probe compared float16-rounded losses to 1e-4 and refused this model as
  # "mixes examples"; it now runs the layers in float32 (tests/integration/test_mixed_precision.py).
  model = _functional(lambda ids: keras.layers.Dense(1, dtype="float32")(
      keras.layers.Dense(4, dtype="mixed_float16", name="half")(Embedding(VOCAB, 4)(ids))))
  half = model.get_layer("half")
  before = half.kernel.numpy()
  _fit(model)
  assert half.compute_dtype == "float16" and not np.array_equal(half.kernel.numpy(), before)


def test_a_dynamic_loss_scale_optimizer_is_refused_naming_a_fixed_scale():
  model = _functional(lambda ids: keras.layers.Dense(1)(Embedding(VOCAB, 4)(ids)),
                      optimizer=keras.mixed_precision.LossScaleOptimizer(
                          keras.optimizers.legacy.SGD(0.1)))
  with pytest.raises(ValueError, match=r"LossScaleOptimizer with dynamic=True.*"
                                       r"LossScaleOptimizer\(optimizer, dynamic=False, "
                                       r"initial_scale=S\)"):
    _make_private(model)


def test_two_outputs_with_loss_weights_name_the_tfrs_multi_task_route():
  ids = keras.Input(shape=(), dtype=tf.int64)
  hidden = Embedding(VOCAB, 4)(ids)
  model = keras.Model(ids, {"click": keras.layers.Dense(1, name="click")(hidden),
                            "rating": keras.layers.Dense(1, name="rating")(hidden)})
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss={"click": BCE, "rating": BCE},
                loss_weights={"click": 1.0, "rating": 0.5})
  with pytest.raises(ValueError, match=r"got 2 for the 2 output\(s\) of model '\w+' with "
                                       r"loss_weights.*tfrs.Model.*"
                                       r"Reduction.NONE.*weighted sum from compute_loss"):
    _fit(model, y={"click": LABELS, "rating": LABELS})


def test_time_distributed_dense_names_dropping_the_wrapper():
  wrapped = keras.layers.TimeDistributed(keras.layers.Dense(3))
  model = _functional(lambda ids: keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(
      wrapped(Embedding(VOCAB, 4, combiner=None)(ids)))), ids_shape=(3,))
  with pytest.raises(ValueError, match=r"'time_distributed' \(TimeDistributed\).*drop the "
                                       r"TimeDistributed wrapper"):
    _make_private(model)


def test_embedding_mask_zero_masks_padding_and_round_trips():
  layer = Embedding(VOCAB, 4, combiner=None, mask_zero=True)
  ids = tf.constant([[3, 0, 0], [5, 7, 0]], tf.int64)
  np.testing.assert_array_equal(layer.compute_mask(ids), [[True, False, False],
                                                          [True, True, False]])
  config = layer.get_config()
  assert config["mask_zero"] and Embedding.from_config(config).compute_mask(ids) is not None
  with pytest.raises(ValueError, match=r"mask_zero=True.*combiner 'sum'.*use combiner=None"):
    Embedding(VOCAB, 4, mask_zero=True)(ids)


def test_embedding_mask_zero_trains_privately_with_padding_left_out():
  """A masked average of the tokens: the padding's row moves by the noise alone (sigma 1e-6).

  Without the mask (mask_zero=False) row 0 moves by 0.07: it is two of every three tokens.
  """
  keras.utils.set_random_seed(3)
  table = Embedding(VOCAB, 4, combiner=None, mask_zero=True)
  model = _functional(lambda ids: keras.layers.Dense(1)(
      keras.layers.GlobalAveragePooling1D()(table(ids))), ids_shape=(3,))
  padded = np.stack([IDS % (VOCAB - 1) + 1, np.zeros(N, int), np.zeros(N, int)], 1)
  before = table.embeddings.numpy()
  sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", noise_seed=1, sigma1=0.1,
                                                   sigma2=1e-6, threshold=0.5),
                         num_examples=N, batch_size=BATCH)
  clicks = np.ones(N, "float32")  # one sign for every example's gradient: nothing cancels
  model.fit(tf.data.Dataset.from_tensor_slices((padded, clicks)).batch(BATCH), verbose=0)
  moved = np.abs(table.embeddings.numpy() - before).max(axis=1)
  assert moved[0] < 1e-5 < 1e-3 < moved[1:].min()


def _layer_norm_and_dense_on_tokens(layer_norm=True):
  """The fix of the TimeDistributed refusal on [B, 3] tokens, a Dense on the table's [B, T, k]
  rows; with ``layer_norm``, also the LayerNormalization one's, a weightless one before the
  logit."""
  def hidden(ids):
    rows = keras.layers.Dense(3)(Embedding(VOCAB, 4, combiner=None)(ids))
    pooled = keras.layers.GlobalAveragePooling1D()(rows)
    if layer_norm:
      pooled = keras.layers.LayerNormalization(center=False, scale=False)(pooled)
    return keras.layers.Dense(1)(pooled)
  return _functional(hidden, ids_shape=(3,))


# The fast tier trains two models with all four fixes: the multi-task one's TFRS Ranking tasks
# take [B, 1] labels; the other has both layer fixes. The slow tier trains each fix alone.
@pytest.mark.parametrize("fixed", first_case_fast([
    "multi-task", "LayerNormalization, Dense on [B, T, k]", "labels [B, 1]",
    "LayerNormalization", "Dense on [B, T, k]"], fast=2))
def test_the_fix_a_message_names_trains_privately(fixed):
  tokens = np.stack([IDS, (IDS + 1) % VOCAB, (IDS + 2) % VOCAB], 1)
  model, x = {
      "multi-task": lambda: (_compiled(_TwoTasks()), IDS),
      "LayerNormalization, Dense on [B, T, k]": lambda: (_layer_norm_and_dense_on_tokens(),
                                                         tokens),
      "labels [B, 1]": lambda: (_compiled(_Ranking(labels_shape=[-1, 1])), IDS),
      "LayerNormalization": lambda: (_functional(lambda ids: keras.layers.Dense(1)(
          keras.layers.LayerNormalization(center=False, scale=False)(
              Embedding(VOCAB, 4)(ids)))), IDS),
      "Dense on [B, T, k]": lambda: (_layer_norm_and_dense_on_tokens(layer_norm=False),
                                     tokens),
  }[fixed]()
  private = _make_private(model)
  model.fit(tf.data.Dataset.from_tensor_slices((x, LABELS)).batch(BATCH), verbose=0)
  assert int(private.steps_taken.numpy()) == N // BATCH and private.epsilon() > 0
