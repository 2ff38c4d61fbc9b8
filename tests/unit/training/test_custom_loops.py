"""Custom training loops on a private model: the DP step or nothing.

A loop that applies its own gradients through the private model's optimizer
would train without DP while ``epsilon()`` counts none of it: refused. A loop
that calls ``model.train_step`` (or the function ``make_train_function``
returns) takes DP steps, each example computed alone
(test_per_example.py), counted and accounted as ``fit``'s.
"""

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.training.dp_step.update_guard import UpdateOutsideDPStepError

from support.keras_models import one_table_model

N, B, VOCAB = 64, 16, 20


DPSGD = sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0, noise_seed=2)


def private_model(config=DPSGD):
  model = one_table_model(VOCAB)
  private = sparse_dp.make_private(model, config, num_examples=N, batch_size=B)
  return model, private


def batch():
  rng = np.random.default_rng(0)
  return (tf.constant(rng.integers(0, VOCAB, B), tf.int64),
          tf.constant(rng.integers(0, 2, (B, 1)), tf.float32))


def tape_step(model, x, y):
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(model.compiled_loss(y, model(x, training=True)))
  gradients = tape.gradient(loss, model.trainable_variables)
  model.optimizer.apply_gradients(zip(gradients, model.trainable_variables))


@pytest.mark.parametrize("compiled", [False, True])
def test_a_gradient_tape_loop_through_the_private_optimizer_is_refused(compiled):
  model, private = private_model()
  weights = [w.numpy() for w in model.trainable_weights]
  step = tf.function(tape_step) if compiled else tape_step
  with pytest.raises(UpdateOutsideDPStepError, match="model.train_step"):
    step(model, *batch())
  with pytest.raises(UpdateOutsideDPStepError):
    model.optimizer.minimize(lambda: tf.reduce_sum(model.trainable_weights[0]),
                             model.trainable_weights)
  for before, after in zip(weights, model.trainable_weights):
    np.testing.assert_array_equal(before, after.numpy())
  assert private.epsilon() == 0.0


def test_a_recompiled_optimizer_is_guarded_too():
  model, _ = private_model()
  model.compile(optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  with pytest.raises(UpdateOutsideDPStepError):
    tape_step(model, *batch())


def test_train_step_and_make_train_function_called_directly_are_dp_steps():
  model, private = private_model()
  step = tf.function(model.train_step)
  before = model.trainable_weights[0].numpy()
  for _ in range(2):
    step(batch())
  assert int(private.steps_taken.numpy()) == 2
  # make_private made the optimizer's slots: the first trace makes no variable, so the
  # step is traced once (a trace that makes variables is traced again).
  assert step.experimental_get_tracing_count() == 1
  once = private.epsilon()
  assert once > 0 and not private.poisson_sampling  # its own batches: not Poisson
  train = model.make_train_function()
  train(iter(tf.data.Dataset.from_tensors(batch()).repeat()))
  assert int(private.steps_taken.numpy()) == 3 and private.epsilon() > once
  assert np.any(model.trainable_weights[0].numpy() != before)


# Weights moved outside the DP step by anything else: detected from the weights.


def test_an_outer_models_fit_moves_the_private_weights_and_no_epsilon_is_given():
  inner, private = private_model()
  ids = keras.Input(shape=(), dtype=tf.int64)
  outer = keras.Model(ids, inner(ids))
  outer.compile(optimizer=keras.optimizers.legacy.SGD(0.5),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  inner.fit(private.poisson_dataset(*batch_of(N)), verbose=0)
  assert private.epsilon() > 0  # DP steps only: an epsilon
  outer.fit(*batch(), verbose=0)  # moves the inner weights, no DP
  with pytest.raises(sparse_dp.training.WeightsMovedOutsideDPError, match="outside its DP steps"):
    private.epsilon()
  with pytest.raises(sparse_dp.training.WeightsMovedOutsideDPError):
    private.report()
  with pytest.raises(sparse_dp.training.WeightsMovedOutsideDPError):
    inner.fit(private.poisson_dataset(*batch_of(N)), verbose=0)


def test_restored_weights_are_the_dp_steps_own(tmp_path):
  model, private = private_model()
  model.fit(private.poisson_dataset(*batch_of(N)), verbose=0)
  model.save_weights(str(tmp_path / "w"))
  saved = model.get_weights()
  model.fit(private.poisson_dataset(*batch_of(N)), verbose=0)
  model.load_weights(str(tmp_path / "w"))  # TF format: weights and DP state
  assert private.epsilon() > 0
  model.set_weights(saved)
  assert private.epsilon() > 0
  model.save_weights(str(tmp_path / "w.h5"))
  model.load_weights(str(tmp_path / "w.h5"))
  assert private.epsilon() > 0


def batch_of(rows):
  rng = np.random.default_rng(1)
  return (rng.integers(0, VOCAB, rows).astype("int64"),
          rng.integers(0, 2, (rows, 1)).astype("float32"))
