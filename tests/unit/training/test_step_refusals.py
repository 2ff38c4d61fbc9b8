"""The budget and the batch-size bound hold inside the DP step, compiled by XLA and called
directly (no host guard runs): a refused step applies an update that uses no data, is not
counted, and ``epsilon()`` refuses (``sparse_dp.training.wrappers.dp_train_step``)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp.training import StepsRefusedError

from support.keras_models import one_table_model
from support.tiers import first_case_fast

N, B, VOCAB = 256, 16, 20


def compiled_private(budget=None):
  model = one_table_model(VOCAB, jit_compile=True)
  config = sparse_dp.DPConfig("dpsgd", noise_multiplier=0.8, epsilon_budget=budget, noise_seed=2)
  private = sparse_dp.make_private(model, config, num_examples=N, batch_size=B)
  # The optimizer's hyperparameter variables, made now: made by the first trace, they would
  # have tf.function trace the step a second time (the graph is the same).
  model.optimizer.learning_rate
  return model, private


def batch(rows):
  rng = np.random.default_rng(rows)
  return (tf.constant(rng.integers(0, VOCAB, rows), tf.int64),
          tf.constant(rng.integers(0, 2, (rows, 1)), tf.float32))


def direct_step(model, private, route):
  """The DP step as a custom loop calls it: ``make_train_function()`` of a model compiled
  with ``jit_compile=True``, or ``tf.function(model.train_step, jit_compile=True)``."""
  if route == "make_train_function":
    train = model.make_train_function()
    return lambda data: train(iter(tf.data.Dataset.from_tensors(data)))
  return tf.function(model.train_step, jit_compile=True)


def weights(model):
  return [w.numpy() for w in model.trainable_weights]


# One route of each refusal in the fast tier (the other slow): both compile the same DP step.
ROUTES = ["train_step", "make_train_function"]


@pytest.mark.parametrize("route", first_case_fast(ROUTES, ROUTES))
def test_steps_past_the_budget_apply_no_update_and_epsilon_refuses(route):
  model, private = compiled_private(budget=1.0)
  limit = private.max_steps_within_budget()
  assert 0 < limit < 30
  step = direct_step(model, private, route)
  initial = weights(model)
  for _ in range(limit):
    step(batch(B))
  at_budget = weights(model)
  # Batches within the bound and the budget train and count (as in the last test, slow).
  assert int(private.steps_taken.numpy()) == limit and private.epsilon() > 0
  assert any(np.any(old != new) for old, new in zip(initial, at_budget))
  for _ in range(5):
    step(batch(B))
  assert int(private.steps_taken.numpy()) == limit  # none of the five counted
  for before, after in zip(at_budget, weights(model)):
    np.testing.assert_array_equal(before, after)
  with pytest.raises(StepsRefusedError, match="refused 5 step"):
    private.epsilon()


@pytest.mark.parametrize("route", first_case_fast(ROUTES[::-1], ROUTES[::-1]))
def test_a_full_data_batch_called_directly_applies_no_update(route):
  """q = 1 steps on a run declared at q = B / N: the accountant's epsilon would be false."""
  model, private = compiled_private()
  before = weights(model)
  step = direct_step(model, private, route)
  for _ in range(3):
    logs = step(batch(N))
  assert int(private.steps_taken.numpy()) == 0
  for old, new in zip(before, weights(model)):
    np.testing.assert_array_equal(old, new)
  assert all(float(value) == 0.0 for key, value in logs.items()
             if key in ("noisy_gradient_norm",))  # nothing of the batch is released
  with pytest.raises(StepsRefusedError):
    private.epsilon()


# Slow: the fast test_steps_past_the_budget_apply_no_update_and_epsilon_refuses[train_step]
# asserts the same of its steps within the budget.
@pytest.mark.slow
def test_a_batch_within_the_bound_still_trains_when_called_directly():
  model, private = compiled_private()
  before = weights(model)
  direct_step(model, private, "train_step")(batch(B))
  assert int(private.steps_taken.numpy()) == 1 and private.epsilon() > 0
  assert any(np.any(old != new) for old, new in zip(before, weights(model)))
