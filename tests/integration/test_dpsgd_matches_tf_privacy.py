"""sparse-dp's DP-SGD clips exactly as TF Privacy's DPModel (fast gradient clipping)."""

import numpy as np
import pytest
import tensorflow as tf

from support.stacks import NO_TF_PRIVACY, TF_PRIVACY_STACK

if not TF_PRIVACY_STACK:
  pytest.skip(NO_TF_PRIVACY, allow_module_level=True)

from tensorflow_privacy.privacy.fast_gradient_clipping import clip_grads, layer_registry  # noqa: E402,I001

from sparse_dp import keras  # noqa: E402
from sparse_dp.layers import Embedding  # noqa: E402
from sparse_dp.training.dp_step import dense_layers  # noqa: E402
from sparse_dp.training.dp_step.step import StepNoise, private_gradients  # noqa: E402

VOCAB, BATCH, CLIP = 40, 16, 0.3


def model_with(table_layer):
  ids = keras.Input(shape=(), dtype=tf.int64)
  hidden = keras.layers.Dense(6, activation="tanh")(table_layer(ids))
  return keras.Model(ids, keras.layers.Dense(1)(hidden))


def test_clipped_gradient_equals_tf_privacy():
  rng = np.random.default_rng(3)
  ids = tf.constant(rng.integers(0, VOCAB, BATCH), tf.int64)
  labels = tf.constant(rng.integers(0, 2, (BATCH, 1)), tf.float32)
  theirs = model_with(keras.layers.Embedding(VOCAB, 5))
  ours = model_with(Embedding(VOCAB, 5))
  # Ours also carries a non-trainable DP record (sparse_dp.training.dp_state.dp_record).
  for mine, reference in zip(ours.trainable_variables, theirs.trainable_variables, strict=True):
    mine.assign(reference)

  loss = keras.losses.BinaryCrossentropy(from_logits=True)  # mean over the batch
  theirs.compile(optimizer="sgd", loss=loss)
  reference, _, _ = clip_grads.compute_clipped_gradients_and_outputs(
      theirs, CLIP, layer_registry.make_default_layer_registry(), ids, labels,
      clipping_loss=loss)

  def losses_of(data):
    x, y = data
    return keras.losses.binary_crossentropy(y, ours(x), from_logits=True), None, None

  noise = StepNoise(gradient_multiplier=0.0, contribution_multiplier=None, l2_norm_clip=CLIP,
                    contribution_clip=1.0, threshold=1.0, expected_batch_size=float(BATCH))
  gradients, _, _ = private_gradients(dense_layers.trainable_leaf_layers(ours), losses_of,
                                      (ids, labels), noise, tf.constant([0, 0], tf.int64))
  for variable, expected in zip(ours.trainable_variables, reference):
    # TF Privacy differentiates the mean of the clipped losses; we divide the
    # clipped sum by the (here equal) expected batch size.
    np.testing.assert_allclose(tf.convert_to_tensor(gradients[variable.ref()]).numpy(),
                               tf.convert_to_tensor(expected).numpy(), rtol=1e-4, atol=1e-7)
