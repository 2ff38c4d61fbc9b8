"""make_private trains Keras models with every algorithm through model.fit."""

import collections
import functools

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp._keras import Keras3ModelError
from sparse_dp.mechanisms import BucketRemapping, bucket_counts, dp_top_k

from support.keras_models import VOCAB, N, SubclassedModel, functional_model, synthetic_data
from support.tiers import first_case_fast

CONFIGS = {
    "dpsgd": dict(noise_multiplier=0.8),
    "adafest": dict(sigma1=3.0, sigma2=0.8, threshold=3.0),
}


OPTIMIZERS = {"sgd": lambda: keras.optimizers.legacy.SGD(0.5),
              "adam": lambda: keras.optimizers.Adam(0.01),
              "rowwise-adagrad": lambda: sparse_dp.optimizers.RowwiseAdagrad(0.5)}


def fit(model, private, ids, labels, epochs=3):
  dataset = private.poisson_dataset(ids, labels, epochs=epochs)
  return model.fit(dataset, verbose=0, callbacks=[private.callback()])


def accuracy_model(optimizer="sgd"):
  """:func:`functional_model` with ``OPTIMIZERS[optimizer]``, compiled with an accuracy metric."""
  model = functional_model(optimizer=OPTIMIZERS[optimizer]())
  model.compile(optimizer=model.optimizer, loss=model.loss, metrics=["accuracy"])
  return model


@functools.lru_cache(maxsize=None)  # the loss before training, the same for every optimizer
def initial_loss():
  """The loss of :func:`accuracy_model`'s initial weights on :func:`synthetic_data`."""
  return accuracy_model().evaluate(*synthetic_data(), verbose=0)[0]


Run = collections.namedtuple("Run", "after logs steps epsilon report traces weights slots")


def trained(algorithm, optimizer="sgd"):
  """:func:`_trained`, its logs and arrays copied: the tests that read the fit cannot change it."""
  run = _trained(algorithm, optimizer)
  return run._replace(logs={name: list(values) for name, values in run.logs.items()},
                      weights=[w.copy() for w in run.weights], slots=[w.copy() for w in run.slots])


@functools.lru_cache(maxsize=None)  # several tests read the same fit
def _trained(algorithm, optimizer="sgd"):
  """3 epochs of ``algorithm`` on :func:`accuracy_model`: the loss after, the fit's logs, the
  steps, the epsilon, the report, how many times ``fit`` traced the DP step, the trained
  weights and the optimizer's (values, not the model). ``_trained.__wrapped__`` runs it again."""
  ids, labels = synthetic_data()
  model = accuracy_model(optimizer)
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig(algorithm, noise_seed=1, **CONFIGS[algorithm]),
      num_examples=N, batch_size=256)
  traces = []
  step = model.train_step
  model.train_step = lambda data: traces.append(1) or step(data)  # runs when traced
  history = fit(model, private, ids, labels)
  return Run(model.evaluate(ids, labels, verbose=0)[0], history.history,
             private.accountant.steps, private.epsilon(), private.report(), len(traces),
             [w.numpy() for w in model.trainable_weights], model.optimizer.get_weights())


@pytest.mark.parametrize("algorithm", ["dpsgd", "adafest"])
def test_algorithm_lowers_loss_and_reports_epsilon(algorithm):
  run = trained(algorithm)
  assert run.after < initial_loss() - 0.1
  assert 0 < run.logs["epsilon"][-1] == pytest.approx(run.epsilon) and run.steps == 48
  assert run.report.poisson_sampling
  if algorithm == "adafest":
    assert run.logs["gradient_size_reduction"][-1] > 2


@pytest.mark.parametrize("algorithm", ["fest", "adafest+"])
def test_preselection_algorithms_train_on_kept_buckets(algorithm, seed):
  ids, labels = synthetic_data()
  k, epsilon1 = 30, 1.0  # Gumbel scale k / epsilon1 = 30 against counts in the hundreds
  kept = dp_top_k(bucket_counts(tf.constant(ids), VOCAB), k, epsilon1, seed)
  remap = BucketRemapping(kept)
  remapped = remap(tf.constant(ids)).numpy()
  model = functional_model(vocabulary=remap.vocabulary_size)
  before = model.evaluate(remapped, labels, verbose=0)
  noise = CONFIGS["dpsgd" if algorithm == "fest" else "adafest"]
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig(algorithm, noise_seed=1, selection_epsilon=epsilon1, **noise),
      num_examples=N, batch_size=256)
  history = fit(model, private, remapped, labels)
  assert model.evaluate(remapped, labels, verbose=0) < before - 0.05
  assert history.history["epsilon"][-1] > epsilon1  # the selection is charged
  assert private.report().to_dict()["selection_epsilon"] == epsilon1


def test_none_equals_plain_keras():
  ids, labels = synthetic_data()
  plain, private_model = functional_model(seed=7), functional_model(seed=7)
  sparse_dp.make_private(private_model, sparse_dp.DPConfig("none", noise_seed=1), num_examples=N,
                         batch_size=128)
  for model in (plain, private_model):
    keras.utils.set_random_seed(11)
    model.fit(ids, labels, batch_size=128, epochs=2, verbose=0)
  for a, b in zip(plain.get_weights(), private_model.get_weights()):
    np.testing.assert_array_equal(a, b)


def test_subclassed_model_and_target_epsilon():
  ids, labels = synthetic_data()
  model = SubclassedModel()
  model.compile(optimizer=keras.optimizers.Adam(0.02),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  model(tf.constant(ids[:2]))
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig("adafest", noise_seed=1, target_epsilon=2.0, threshold=3.0),
      num_examples=N, batch_size=256, epochs=2)
  assert isinstance(model.optimizer, sparse_dp.optimizers.LazyAdam)
  # An absolute threshold leaves the noise ratio to the rule, and threshold_sigmas unused.
  config = private.config
  assert private.spec.sigma1 / private.spec.sigma2 == pytest.approx(config.sigma_ratio)
  assert config.threshold_sigmas is None and config.threshold_for(private.spec.sigma1) == 3.0
  fit(model, private, ids, labels, epochs=2)
  assert 1.9 < private.epsilon() <= 2.0


def test_training_stops_before_exceeding_the_budget_and_the_step_refuses_past_it(capsys):
  ids, labels = synthetic_data()
  model = functional_model()
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig("dpsgd", noise_seed=1, noise_multiplier=2.0, epsilon_budget=1.0),
      num_examples=N, batch_size=256)
  fit(model, private, ids, labels, epochs=10)
  steps = private.accountant.steps
  assert 0 < steps < 160 and steps == int(private.step_limit.numpy())
  assert private.epsilon() <= 1.0 < private.epsilon(steps + 1)
  assert "would exceed the epsilon budget" in capsys.readouterr().out
  # A second fit on the spent budget fails before taking a step. (The
  # non-trainable dp_record weights also record the Poisson datasets made.)
  weights = [w.numpy() for w in model.trainable_weights]
  with pytest.raises(sparse_dp.training.BudgetExhaustedError, match="allows no further step"):
    fit(model, private, ids, labels)
  # Without the callback the step itself refuses the step past the budget; the fit
  # above ran every step up to it, so the step allows exactly the budget's steps.
  with pytest.raises(tf.errors.InvalidArgumentError, match="allows no further step"):
    model.fit(private.poisson_dataset(ids, labels, epochs=10), verbose=0)
  assert private.accountant.steps == steps and private.epsilon() <= 1.0
  for a, b in zip(weights, model.trainable_weights):
    np.testing.assert_array_equal(a, b.numpy())


def test_model_without_loss_or_with_unsupported_layer_is_refused():
  inputs = keras.Input(shape=(3,))
  model = keras.Model(inputs, keras.layers.LayerNormalization(name="norm")(inputs))
  model.compile(optimizer="sgd", loss="mse")
  with pytest.raises(sparse_dp.training.UnsupportedLayerError, match="'norm'"):
    sparse_dp.make_private(model, sparse_dp.DPConfig("dpsgd", noise_seed=1, noise_multiplier=1.0),
                           num_examples=10, batch_size=2)


@pytest.mark.parametrize("algorithm", ["dpsgd", "adafest"])
def test_gradient_accumulation_trains_with_noise_once_per_batch(algorithm):
  ids, labels = synthetic_data()
  model = accuracy_model()
  # Builds the accuracy metric the step updates: without it fit traces the step twice.
  before = model.evaluate(ids, labels, verbose=0)[0]
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig(algorithm, noise_seed=1, microbatch_size=64, debug_metrics=True,
                                **CONFIGS[algorithm]),
      num_examples=N, batch_size=256)
  history = fit(model, private, ids, labels)
  assert model.evaluate(ids, labels, verbose=0)[0] < before - 0.1
  assert private.accountant.steps == 48  # one accounted step per logical batch
  assert 0 < history.history["accuracy"][-1] <= 1  # un-noised: logged on request only
  assert "NOT covered by this epsilon" in private.report().statement()


def test_logs_hold_no_un_noised_statistic_by_default():
  run = trained("adafest")  # compiled with an accuracy metric
  assert set(run.logs) == {"epsilon", "nonzero_rows", "nonzero_rows_min", "nonzero_rows_max",
                           "nonzero_coordinates", "gradient_size_reduction", "noisy_gradient_norm"}
  assert "debug_metrics" not in run.report.to_dict()


def test_noise_seed_is_secret_by_default_and_reproducible_when_fixed():
  ids, labels = synthetic_data()

  def trained_without_seed():
    model = functional_model()
    private = sparse_dp.make_private(model, sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0),
                                     num_examples=N, batch_size=256)
    model.fit(private.poisson_dataset(ids, labels, epochs=0.1), verbose=0)
    return model.get_weights()[0]

  assert not np.array_equal(trained_without_seed(), trained_without_seed())  # fresh OS seeds
  # DPConfig(noise_seed=1): the same run again, 48 steps, trains the same weights.
  for shared, again in zip(trained("dpsgd").weights, _trained.__wrapped__("dpsgd").weights):
    np.testing.assert_array_equal(shared, again)


def test_unbuilt_subclassed_model_is_refused_clearly():
  model = SubclassedModel()
  model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  with pytest.raises(ValueError, match="is not built.*Call the model on a batch first"):
    sparse_dp.make_private(model, sparse_dp.DPConfig("dpsgd", noise_seed=1, noise_multiplier=1.0),
                           num_examples=N, batch_size=256)


def test_keras_3_model_is_refused_by_make_private_naming_the_fix():
  if tuple(int(part) for part in tf.__version__.split(".")[:2]) < (2, 16):
    pytest.skip(f"TensorFlow {tf.__version__} has no Keras 3: its tf.keras is Keras 2")
  try:
    import keras as keras3
  except ImportError:
    pytest.skip("the standalone keras package (Keras 3) is not installed")
  if not keras3.version().startswith("3."):
    pytest.skip(f"the standalone keras package is {keras3.version()}, not Keras 3")
  model = keras3.Sequential([keras3.Input((1,), dtype="int64"), keras3.layers.Embedding(VOCAB, 4),
                             keras3.layers.Flatten(), keras3.layers.Dense(1)])
  model.compile(optimizer="sgd", loss=keras3.losses.BinaryCrossentropy(from_logits=True))
  with pytest.raises(Keras3ModelError, match="import tf_keras as keras"):
    sparse_dp.make_private(model, sparse_dp.DPConfig("dpsgd", noise_seed=1, noise_multiplier=1.0),
                           num_examples=N, batch_size=256)


@pytest.mark.parametrize("optimizer", first_case_fast(list(OPTIMIZERS)))
def test_fit_traces_the_dp_step_once_and_trains_as_with_lazy_slots(optimizer, monkeypatch):
  made_first = trained("adafest", optimizer)
  # The optimizer's slots are made before fit traces its step: a trace that makes
  # variables is traced again, which doubles the start-up of a model of many tables.
  assert made_first.traces == 1
  with monkeypatch.context() as lazy:
    lazy.setattr(sparse_dp.training.wrappers.private_training.PrivateTraining,
                 "create_optimizer_weights", lambda self: None)
    made_lazily = _trained.__wrapped__("adafest", optimizer)
  assert made_lazily.traces == 2  # what this test would see without them
  assert len(made_first.slots) == len(made_lazily.slots)
  for first, lazily in zip(made_first.weights + made_first.slots,
                           made_lazily.weights + made_lazily.slots):
    np.testing.assert_array_equal(first, lazily)
