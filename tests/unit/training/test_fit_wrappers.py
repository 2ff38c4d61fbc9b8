"""What make_private's fit and compile check: recompiles, steps_per_execution, validation data."""

import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.accounting import PrivacyAccountant
from sparse_dp.layers import embedding_backends
from sparse_dp.training.checks.validation import ModelValidationError
from sparse_dp.training.poisson import padded_batches

from support.gaussian_composition import poisson_gaussians_epsilon
from support.keras_models import N, functional_model, synthetic_data

SIGMA, BATCH = 1.0, 256  # q = 1/16: 16 steps per epoch


def private_model(**config):
  model = functional_model()
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig("dpsgd", noise_multiplier=SIGMA, noise_seed=1, **config),
      num_examples=N, batch_size=BATCH)
  return model, private


def train(model, private, epochs=0.25, **fit_options):
  ids, labels = synthetic_data()
  return model.fit(private.poisson_dataset(ids, labels, epochs=epochs), verbose=0,
                   callbacks=[private.callback()], **fit_options)


def centred_loss(y, logits):
  """Binary cross-entropy minus the batch's mean: each loss depends on the whole batch."""
  losses = keras.losses.binary_crossentropy(y, logits, from_logits=True)
  return losses - tf.reduce_mean(losses)


def test_on_a_tpu_the_step_counts_as_compiled_and_keras_never_nests_it(monkeypatch):
  """A TPU compiles every program and drops its asserts, whatever ``jit_compile`` says
  (``on_tpu`` is a double here): ``poisson_dataset`` pads its batches and ``fit`` refuses a
  too large batch on the host, before any step. Keras's ``jit_compile`` is off after
  ``make_private`` and after a recompile: it would nest the step in a compiled function inside
  ``strategy.run``, where ``TPUEmbeddingV2``'s enqueue refuses to run."""
  monkeypatch.setattr(embedding_backends, "on_tpu", lambda strategy: True)
  model = functional_model()
  model.jit_compile = True
  private = sparse_dp.make_private(model, sparse_dp.DPConfig("dpsgd", noise_multiplier=SIGMA),
                                   num_examples=N, batch_size=BATCH)
  assert not model.jit_compile and private.compiled_by_xla
  ids, labels = synthetic_data()
  assert padded_batches.is_padded(private.poisson_dataset(ids, labels).element_spec)
  model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True),
                jit_compile=True)
  assert not model.jit_compile
  with pytest.raises(ValueError, match="larger than any Poisson sample"):
    model.fit(ids, labels, batch_size=4 * BATCH, verbose=0)
  assert int(private.steps_taken.numpy()) == 0 == int(private.refused_steps.numpy())


class BatchEpsilons(keras.callbacks.Callback):
  """The epsilon of every batch log."""

  def __init__(self):
    super().__init__()
    self.values = []

  def on_train_batch_end(self, batch, logs=None):
    self.values.append(float(logs["epsilon"]))


def test_batch_logs_then_recompiles_of_the_trained_model():
  """Batch logs carry only an epsilon already spent; a recompile with an ordinary loss keeps
  training privately; one with a loss that couples the examples is probed and refused."""
  model, private = private_model()
  recorder = BatchEpsilons()
  ids, labels = synthetic_data()
  model.fit(private.poisson_dataset(ids, labels, epochs=0.5), verbose=0,
            callbacks=[private.callback(log_every_steps=3), recorder])  # 8 steps
  def spent(steps):
    return PrivacyAccountant().step(SIGMA, BATCH / N, steps).get_epsilon(1 / N)
  # Step k logs the epsilon of the last multiple of 3 within k: never that of a later step.
  assert recorder.values == pytest.approx([spent(k) for k in (0, 0, 3, 3, 3, 6, 6, 6)],
                                          rel=1e-6)
  assert recorder.values[0] == 0 and recorder.values[-1] < private.epsilon()

  model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  assert isinstance(model.optimizer, sparse_dp.optimizers.LazyAdam)  # table updates stay sparse
  history = train(model, private)
  steps = 8 + 4
  assert int(private.steps_taken.numpy()) == steps and private.poisson_sampling
  assert history.history["epsilon"][-1] == pytest.approx(
      poisson_gaussians_epsilon(BATCH / N, steps, 1 / N, SIGMA), rel=1e-3)

  model.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=centred_loss)
  weights = [w.numpy() for w in model.trainable_weights]
  with pytest.raises(ModelValidationError, match="centred_loss"):
    train(model, private)
  assert int(private.steps_taken.numpy()) == steps
  for before, after in zip(weights, model.trainable_weights):
    assert (before == after.numpy()).all()


def test_recompiling_with_an_optimizer_without_sparse_updates_is_refused():
  model, _ = private_model()
  with pytest.raises(ValueError, match="RMSprop is not supported"):
    model.compile(optimizer="rmsprop", loss=keras.losses.BinaryCrossentropy(from_logits=True))


def test_steps_per_execution_with_a_budget_is_refused_at_make_private_and_compile():
  model = functional_model()
  model.compile(optimizer=model.optimizer, loss=model.loss, steps_per_execution=4)
  with pytest.raises(ValueError, match=r"steps_per_execution=4.*steps_per_execution=1"):
    sparse_dp.make_private(
        model, sparse_dp.DPConfig("dpsgd", noise_multiplier=SIGMA, epsilon_budget=1.0),
        num_examples=N, batch_size=BATCH)
  model, _ = private_model(epsilon_budget=1.0)
  with pytest.raises(ValueError, match="steps_per_execution='auto'"):
    model.compile(optimizer=model.optimizer, loss=model.loss, steps_per_execution="auto")


def test_steps_per_execution_without_a_budget_and_a_one_loss_list_count_every_step():
  model, private = private_model()
  # A list of one loss is that loss (test_batch_logs_then_recompiles_of_the_trained_model
  # trains after a recompile with a loss that is not a list).
  model.compile(optimizer=model.optimizer, loss=[model.loss], steps_per_execution=3)
  history = train(model, private, epochs=0.5)  # 8 steps: 3 + 3 + 2
  assert int(private.steps_taken.numpy()) == 8
  assert history.history["epsilon"][-1] == pytest.approx(private.epsilon())


@pytest.mark.parametrize("validation", [dict(validation_data="held_out"),
                                        dict(validation_split=0.1)])
def test_validation_in_fit_is_refused_without_debug_metrics(validation):
  ids, labels = synthetic_data()
  model, private = private_model()
  if "validation_data" in validation:
    validation["validation_data"] = (ids[:512], labels[:512])
  with pytest.raises(ValueError, match=f"{next(iter(validation))}.*model.evaluate"
                                       r".*DPConfig\(debug_metrics=True\)"):
    model.fit(ids, labels, batch_size=BATCH, verbose=0, **validation)
  assert int(private.steps_taken.numpy()) == 0


def test_validation_with_debug_metrics_is_logged_and_reported_as_not_private():
  ids, labels = synthetic_data()
  model, private = private_model(debug_metrics=True)
  history = train(model, private, validation_data=(ids[:512], labels[:512]))
  assert "val_loss" in history.history
  assert "NOT covered by this epsilon" in private.report().statement()


@pytest.mark.parametrize("loss, message", [({}, "compiled without a loss"),
                                           (["bce", "mse"], "got 2")])
def test_recompiling_without_one_loss_names_the_fix(loss, message):
  model, private = private_model()
  with pytest.raises(ValueError, match=message):
    model.compile(optimizer="sgd", loss=loss)
    train(model, private)
