"""The DP step compiles with XLA (``jit_compile=True``, as every TPU program is) and
takes the step graph mode takes for the same noise seed."""

import functools
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding
from sparse_dp.mechanisms.noise import dense_noise
from sparse_dp.mechanisms.selection import row_selection
from sparse_dp.optimizers import LazyAdam, RowwiseAdagrad
from sparse_dp.training import BudgetExhaustedError
from sparse_dp.training.dp_step import step
from sparse_dp.training.dp_step.losses import per_example_loss_fn
from sparse_dp.training.dp_step.step import private_gradients
from sparse_dp.training.poisson import padded_batches
from sparse_dp.training.poisson.poisson_sampling import (
  PoissonSample,
  batch_capacity,
  largest_plausible_batch,
)
from sparse_dp.training.wrappers import dp_train_step

import support
import support.replicas
from support.keras_models import VOCAB, N, functional_model, synthetic_data
from support.stacks import one_stack

NOISE = {"dpsgd": dict(noise_multiplier=0.8),
         "adafest": dict(sigma1=3.0, sigma2=0.8, threshold=3.0)}
CONFIGS = {
    "none": {},
    "dpsgd": NOISE["dpsgd"],
    "fest": dict(NOISE["dpsgd"], selection_epsilon=0.5),
    "adafest": NOISE["adafest"],
    "adafest+": dict(NOISE["adafest"], selection_epsilon=0.5),
}


def trained(algorithm, jit_compile, optimizer=None, padded=None, microbatch_size=None):
  """Trained weights and logs after 4 Poisson batches (padded by default under XLA)."""
  ids, labels = synthetic_data()
  model = functional_model(seed=3)
  model.compile(optimizer=optimizer or keras.optimizers.legacy.SGD(0.5),
                loss=keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=jit_compile)
  config = sparse_dp.DPConfig(algorithm, noise_seed=1, microbatch_size=microbatch_size,
                              **CONFIGS[algorithm])
  private = sparse_dp.make_private(model, config, num_examples=N, batch_size=256)
  dataset = private.poisson_dataset(ids, labels, epochs=1, padded=padded)
  history = model.fit(dataset.take(4), verbose=0)
  return [w.numpy() for w in model.trainable_weights], history.history, private


@functools.lru_cache(maxsize=None)
def _graph_steps(algorithm, microbatch_size):
  weights, logs, _ = trained(algorithm, False, microbatch_size=microbatch_size)
  return weights, logs


def graph_steps(algorithm, microbatch_size=None):
  """:func:`trained`'s weights and logs in graph mode (SGD, unpadded), fitted once a config."""
  weights, logs = _graph_steps(algorithm, microbatch_size)
  return [w.copy() for w in weights], {name: list(values) for name, values in logs.items()}


# Slow cases comparing with the graph-mode reference another slow case fits (graph_steps,
# cached in the process) run on one stack, where one fit serves both.
SHARED_GRAPH_STEPS = one_stack("tf2.21")


# One DP-SGD and one DP-AdaFEST case in the fast tier; the others compile in the slow tier.
@pytest.mark.parametrize("algorithm,optimizer", [
    ("dpsgd", None), ("adafest", None),
    *(pytest.param(*case, marks=pytest.mark.slow) for case in [
        ("none", None), ("adafest+", None),
        ("adafest", lambda: LazyAdam(0.05)), ("adafest", lambda: RowwiseAdagrad(0.05))]),
    pytest.param("fest", None, marks=[pytest.mark.slow, SHARED_GRAPH_STEPS])])
def test_a_compiled_fit_takes_the_graph_steps(algorithm, optimizer):
  make = optimizer or (lambda: None)
  graph, graph_logs = graph_steps(algorithm) if optimizer is None else trained(
      algorithm, False, make())[:2]
  compiled, logs, private = trained(algorithm, True, make())
  assert private.model._jit_compile
  # one trace for the 4 Poisson batches (that padding also spares XLA a compile per batch
  # size: test_xla_fed_unpadded_poisson_batches_warns_that_each_size_compiles)
  assert private.model.train_function.experimental_get_tracing_count() == 1
  for a, b in zip(graph, compiled):
    np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5)
  if algorithm != "none":
    # epsilon() also checks the weight fingerprint that the compiled step kept current
    assert private.accountant.steps == 4 and private.epsilon() > 0
    assert logs["nonzero_rows"] == pytest.approx(graph_logs["nonzero_rows"])
  if algorithm == "adafest":  # its table is fingerprinted: a move outside the step is seen
    table = private.model.get_layer("ids").embeddings
    table.scatter_add(tf.IndexedSlices(tf.random.stateless_normal([1, table.shape[1]], [1, 2]),
                                       [5]))
    with pytest.raises(sparse_dp.training.WeightsMovedOutsideDPError):
      private.epsilon()


@pytest.mark.slow  # the chunks' law is tests/unit/mechanisms/test_dense_noise.py's
@pytest.mark.parametrize("optimizer", [None, lambda: LazyAdam(0.05)], ids=["sgd", "lazy-adam"])
def test_a_compiled_dpsgd_step_on_a_table_of_noise_chunks_takes_the_graph_steps(monkeypatch,
                                                                                optimizer):
  monkeypatch.setattr(dense_noise, "CHUNK_ROWS", 256)  # the table's 1,000 rows: 4 chunks
  make = optimizer or (lambda: None)
  graph, graph_logs, _ = trained("dpsgd", False, make())
  compiled, logs, private = trained("dpsgd", True, make())
  for a, b in zip(graph, compiled):
    np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5)
  assert private.accountant.steps == 4
  np.testing.assert_allclose(logs["noisy_gradient_norm"], graph_logs["noisy_gradient_norm"],
                             rtol=1e-4)


@pytest.mark.parametrize("algorithm,microbatch_size", [
    ("dpsgd", None), ("adafest", None),
    pytest.param("adafest+", None, marks=pytest.mark.slow),
    *(pytest.param(*case, marks=[pytest.mark.slow, SHARED_GRAPH_STEPS])
      for case in [("fest", None), ("adafest", 96)])])
def test_a_padded_batch_takes_the_step_of_its_sampled_examples(algorithm, microbatch_size):
  # Graph mode, same seed: the padding rows (copies of example 0) weigh nothing
  # in the clipping, the contribution map, the noise, or the logged loss.
  plain, plain_logs = graph_steps(algorithm, microbatch_size=microbatch_size)
  padded, logs, _ = trained(algorithm, False, padded=True, microbatch_size=microbatch_size)
  for a, b in zip(plain, padded):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  for name in plain_logs:
    np.testing.assert_allclose(logs[name], plain_logs[name], rtol=1e-5)


def test_padded_poisson_batches_have_one_static_shape_and_mask_the_sampled_examples():
  # That a compiled fit of them traces its step once: test_a_compiled_fit_takes_the_graph_steps.
  ids, labels = synthetic_data()
  _, private = compiled_private()
  dataset = private.poisson_dataset(ids, labels)  # padded: the model is compiled with XLA
  capacity = batch_capacity(N, 256 / N)
  spec = dataset.element_spec
  assert spec[padded_batches.IN_BATCH].shape == [capacity]
  assert [part.shape for part in spec[padded_batches.EXAMPLES]] == [[capacity], [capacity]]
  plain = private.poisson_dataset(ids, labels, padded=False)
  assert plain.element_spec[0].shape.as_list() == [None]
  sizes = [int(np.sum(batch[padded_batches.IN_BATCH])) for batch in dataset.take(20)]
  assert 200 < np.mean(sizes) < 312 and len(set(sizes)) > 5 and max(sizes) < capacity


def test_a_poisson_batch_past_the_padded_capacity_is_refused_not_cut():
  ids, labels = synthetic_data()
  sample = PoissonSample((ids, labels), 0.5, capacity=1000)  # about 2,048 sampled
  with pytest.raises(tf.errors.InvalidArgumentError, match="larger than the padded batch capacity"):
    sample(tf.constant([1, 2], tf.int64))


@pytest.mark.slow
def test_xla_fed_unpadded_poisson_batches_warns_that_each_size_compiles():
  ids, labels = synthetic_data()
  model, private = compiled_private()
  with pytest.warns(UserWarning, match="compiles the DP step again for each new batch size"):
    model.fit(private.poisson_dataset(ids, labels, padded=False).take(1), verbose=0)


@pytest.mark.slow  # micro-batches in graph mode: tests/unit/training/test_dp_step.py
@pytest.mark.parametrize("algorithm", [
    "dpsgd", pytest.param("adafest", marks=SHARED_GRAPH_STEPS)])  # padded-batch test's graph
def test_compiled_micro_batches_take_the_graph_steps(algorithm):
  # 96 does not divide the padded capacity: the last micro-batch is padded on.
  graph, graph_logs = graph_steps(algorithm, microbatch_size=96)
  compiled, logs, private = trained(algorithm, True, microbatch_size=96)
  for a, b in zip(graph, compiled):
    np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5)
  assert private.accountant.steps == 4 and private.epsilon() > 0
  assert logs["nonzero_rows"] == pytest.approx(graph_logs["nonzero_rows"])


def compiled_private(budget=None, microbatch_size=None, noise=None):
  model = functional_model(seed=3)
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.5),
                loss=keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=True)
  if noise is None:
    noise = dict(noise_multiplier=3.0, epsilon_budget=budget) if budget else CONFIGS["adafest"]
  algorithm = "dpsgd" if budget else "adafest"
  config = sparse_dp.DPConfig(algorithm, noise_seed=1, microbatch_size=microbatch_size, **noise)
  return model, sparse_dp.make_private(model, config, num_examples=N, batch_size=256)


def test_a_compiled_step_past_the_budget_is_refused_on_the_host():
  # XLA compiles the step's own assert to nothing: the host refuses the step.
  ids, labels = synthetic_data()
  model, private = compiled_private(budget=0.15)
  limit = int(private.step_limit.numpy())
  assert 0 < limit < 30
  with pytest.raises(BudgetExhaustedError, match="budget 0.15 allows no further step"):
    model.fit(private.poisson_dataset(ids, labels, epochs=3).take(limit + 2), verbose=0)
  assert private.accountant.steps == limit


def test_a_compiled_step_refuses_a_non_poisson_batch_too_large_for_the_rate():
  ids, labels = synthetic_data()
  model, private = compiled_private()
  with pytest.raises(ValueError, match="larger than any Poisson sample.*Realised batch size: 2000"):
    model.fit(ids, labels, batch_size=2000, verbose=0)
  batches = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(2000)
  with pytest.raises(tf.errors.InvalidArgumentError, match="larger than any Poisson sample"):
    model.fit(batches, verbose=0)
  with pytest.raises(ValueError, match="larger than any Poisson sample"):
    model.train_on_batch(ids[:2000], labels[:2000])
  assert private.accountant.steps == 0


@pytest.mark.parametrize("microbatch_size", [None, pytest.param(100, marks=pytest.mark.slow)])
def test_a_compiled_step_refuses_ids_outside_the_vocabulary_and_ignores_them(microbatch_size):
  ids, labels = synthetic_data()
  # tau = 10 sigma1 C1: no false positives (Psi(10) < 1e-23 a row), and only rows many
  # examples look up pass; so the last row moves only if an id outside the vocabulary
  # reached it (XLA clamps an index past the end to the last row). At the usual tau
  # (sigma1 C1) the last row is a false positive w.p. 0.16 a step.
  model, private = compiled_private(microbatch_size=microbatch_size,
                                    noise=dict(CONFIGS["adafest"], threshold=30.0))
  # The first fit's probe (not compiled) would refuse bad ids itself; after it, the
  # compiled step meets them. That first fit is fed padded Poisson batches behind a map:
  # not Poisson any more, so their size is checked on the host by the mask's count, not
  # by the capacity, which exceeds the largest plausible batch (one compiled step for both
  # fits: their batches have one shape).
  assert batch_capacity(N, 256 / N) > largest_plausible_batch(N, 256 / N)
  with pytest.warns(UserWarning, match="through map"):
    model.fit(private.poisson_dataset(ids, labels).map(lambda batch: batch).take(2), verbose=0)
  assert private.accountant.steps == 2 and not private.poisson_sampling
  ids[:50] = VOCAB + 7
  before = model.get_layer("ids").embeddings.numpy()
  with pytest.raises(ValueError,
                     match=r"layer\(s\) ids looked up ids outside the vocabulary.*Under XLA"):
    model.fit(private.poisson_dataset(ids, labels, epochs=1).take(2), verbose=0)
  after = model.get_layer("ids").embeddings.numpy()
  assert np.isfinite(after).all() and np.array_equal(after[-1], before[-1])
  assert model.train_function.experimental_get_tracing_count() == 1


def test_train_on_batch_under_xla_refuses_ids_outside_and_returns_no_flag():
  """The step's flags are an un-noised bit of the batch: never in what train_on_batch returns."""
  ids, labels = synthetic_data()
  model, _ = compiled_private()
  model.train_on_batch(ids[:8], labels[:8])  # the probe (not compiled) passes clean ids
  logs = model.train_on_batch(ids[8:16], labels[8:16], return_dict=True)
  assert not any(key.startswith("sparse_dp_") for key in logs)
  bad = ids[16:24].copy()
  bad[0] = VOCAB + 987654
  with pytest.raises(ValueError, match=r"outside the vocabulary") as refusal:
    model.train_on_batch(bad, labels[16:24])
  assert "987654" not in str(refusal.value) and "1 ids" not in str(refusal.value)


class _History(keras.Model):
  """Multi-valent (ragged) histories summed in one table."""

  def __init__(self):
    super().__init__()
    self.table = Embedding(VOCAB, 4, combiner="sum")
    self.logit = keras.layers.Dense(1)

  def call(self, history):
    return self.logit(self.table(history))


def test_ragged_inputs_under_xla_are_refused_before_any_step_naming_the_fix():
  histories = tf.ragged.constant([[1, 2], [3], [4, 5, 6]] * 100, tf.int64)
  labels = tf.zeros([300, 1])
  model = _History()
  model(histories[:2])
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.5),
                loss=keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=True)
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig("adafest", noise_seed=1, **CONFIGS["adafest"]),
      num_examples=300, batch_size=30)
  refused = r"jit_compile=True, or on a TPU\) is fed ragged or sparse inputs.*compile without"
  with pytest.raises(ValueError, match=refused):
    model.fit(private.poisson_dataset(histories, labels).take(1), verbose=0)
  with pytest.raises(ValueError, match=refused):
    model.train_on_batch(histories[:30], labels[:30])
  assert private.accountant.steps == 0


def test_adagrad_under_xla_is_refused_naming_what_compiles():
  ids, labels = synthetic_data()
  model, private = compiled_private()
  model.compile(optimizer=keras.optimizers.legacy.Adagrad(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=True)
  with pytest.raises(ValueError, match="no XLA kernel.*RowwiseAdagrad.*SGD or Adam"):
    model.fit(private.poisson_dataset(ids, labels, epochs=1), verbose=0)
  assert private.accountant.steps == 0


@pytest.mark.parametrize("jit_compile", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_false_positives_past_their_room_are_refused(monkeypatch, jit_compile):
  # No room at all: every step's false positives overflow (really: probability 1e-18).
  monkeypatch.setattr(row_selection, "false_positive_capacity", lambda *args, **kwargs: 0)
  ids, labels = synthetic_data()
  model = functional_model(seed=3)
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.5),
                loss=keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=jit_compile)
  private = sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", noise_seed=1,
                                                             **CONFIGS["adafest"]),
                                   num_examples=N, batch_size=256)
  with pytest.raises((ValueError, tf.errors.InvalidArgumentError),
                     match="false positives overflowed the room"):
    model.fit(private.poisson_dataset(ids, labels).take(2), verbose=0)


@pytest.mark.slow
def test_a_compiled_fit_compiles_the_step_once_for_all_its_batches():
  # A compile-time constant that depends on the batch's values (as an assert's data
  # inside the per-example vectorized_map once did) would compile every step anew.
  here = support.FOLDER  # the script and the helpers it imports
  env = {**os.environ, "TF_CPP_VMODULE": "device_compiler=1", "TF_CPP_MIN_LOG_LEVEL": "0",
         "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
  done = subprocess.run([sys.executable, str(here / "xla_compilations.py"), "6"], env=env,
                        capture_output=True, text=True, timeout=900, check=True)
  assert "steps 6" in done.stdout
  compilations = done.stderr.count("Compilation of XLA executable")
  assert 1 <= compilations <= 2, done.stderr[-3000:]


@pytest.mark.parametrize("algorithm,microbatch_size", [
    ("adafest", None), ("adafest", 8),  # the selection exchanges the replicas' lookups
    *(pytest.param(*case, marks=pytest.mark.slow) for case in [
        ("dpsgd", None), ("adafest+", None)])])
def test_the_replica_program_of_eight_replicas_compiles_with_static_shapes(
    monkeypatch, algorithm, microbatch_size):
  """A TPU host of 8 replicas compiles one DP step for all: each replica's slice of a padded
  batch (a capacity that is a multiple of 8), the replicas' lookups exchanged, the replica id
  a value of the program (its input: one compiled program runs as replica 0 and as 5).
  Compiled by XLA on one device with static-size collectives
  (:class:`support.replicas.StaticReplicaContext`); a shape that depends on the replica id or
  on an exchanged value does not compile."""
  replicas = 8
  model = functional_model(seed=3)
  config = sparse_dp.DPConfig(algorithm, noise_seed=1, microbatch_size=microbatch_size,
                              **CONFIGS[algorithm])
  private = sparse_dp.make_private(model, config, num_examples=N, batch_size=256)
  capacity = batch_capacity(N, 256 / N, replicas)
  assert capacity % replicas == 0 and capacity >= batch_capacity(N, 256 / N)
  rows = capacity // replicas
  ids, labels = synthetic_data()
  in_batch = tf.range(rows) < rows - 3  # the last replica's slice ends in padding

  @tf.function(jit_compile=True)
  def program(x, y, replica_id):
    monkeypatch.setattr(tf.distribute, "get_replica_context",
                        lambda: support.replicas.StaticReplicaContext(replicas, replica_id))
    try:
      size = dp_train_step._batch_size((x, y), in_batch)
      gradients, _, stats = private_gradients(
          private.leaves, per_example_loss_fn(model), (x, y), private.step_noise,
          tf.constant([1, 2], tf.int64), microbatch_size, in_batch=in_batch)
    finally:
      monkeypatch.undo()
    return size, tf.nest.flatten(list(gradients.values()), expand_composites=True), stats

  for replica_id in (0, 5):
    size, gradients, stats = program(ids[:rows], labels[:rows], tf.constant(replica_id))
    assert int(size) == replicas * (rows - 3)
    assert all(np.isfinite(g).all() for g in gradients)
    assert float(stats.get(step.OVER_CAPACITY, 0.0)) == 0.0  # rooms for every replica's rows
  assert program.experimental_get_tracing_count() == 1  # one program for every replica
