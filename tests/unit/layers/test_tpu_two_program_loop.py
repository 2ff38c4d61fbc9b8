"""The two-program TPU embedding loop (:class:`TPUTrainer`), run through the API double.

Off TPU the API object is :class:`TPUEmbeddingAPIDouble` (``api_factory``),
whose queue and round state are TensorFlow state, so the host enqueues and programs A and B
run as separate ``tf.function``s as on a TPU, and the double fails a program
holding a second dequeue or ``apply_gradients``. DP-AdaFEST steps through the
loop give the CPU backend's tables through ``fit`` on the same batches within
``2e-5`` (lazy Adam, as in ``test_tpu_embedding_live.py``; other float order).
"""

import functools
import json
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.accounting.report import NOT_POISSON
from sparse_dp.cli import main
from sparse_dp.layers import embedding_backends
from sparse_dp.layers.embedding_backends import EmbeddingFeature, hardware
from sparse_dp.layers.embedding_backends.doubles.tpu_api_double import TPUEmbeddingAPIDouble
from sparse_dp.layers.embedding_backends.tpu import example_round
from sparse_dp.layers.recording import recording
from sparse_dp.models.pctr import build_pctr_model, table_ids
from sparse_dp.training import tpu_loop
from sparse_dp.training.tpu_loop import TPUTrainer

import support
from support.keras_models import VOCAB, N, functional_model, synthetic_data
from support.stacks import one_stack
from support.tpu_engine import variables_used

ADAFEST = dict(sigma1=3.0, sigma2=0.8, threshold=6.0, noise_seed=4)
STEP = [("enqueue", False), ("dequeue", False), ("enqueue", True), ("dequeue", True),
        ("apply_gradients",)]


def _private(embedding="cpu", table_placement="default_device", **config):
  model = functional_model(optimizer=keras.optimizers.Adam(0.01), table_placement=table_placement)
  return model, sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", **ADAFEST, **config),
                                       num_examples=N, batch_size=128, embedding=embedding)


def _fixed_batches():
  ids, labels = synthetic_data()
  return tf.data.Dataset.from_tensor_slices((ids, labels)).batch(128).take(3)


@functools.lru_cache(maxsize=None)
def _one_replica_loop():
  """The loop's 3 steps on :func:`_fixed_batches`, one replica, the table on the host.

  Returns:
    ``(model, private, trainer, history, result)``: the live objects, which only
    ``test_loop_steps_equal_fit_...`` reads; and ``result``, the run as it ended (copies: the
    weights, the steps, each step's ``nonzero_rows`` and the API calls), for the two-replica
    test to compare with.
  """
  looped, private = _private(table_placement="host")  # as the loop keeps tables on a TPU
  trainer = TPUTrainer(private, api_factory=TPUEmbeddingAPIDouble)
  history = trainer.fit(_fixed_batches())
  result = {"weights": tuple(w.numpy() for w in looped.trainable_weights),
            "steps": private.accountant.steps,
            "nonzero_rows": [step["nonzero_rows"] for step in history],
            "calls": [list(call) for call in trainer.engine.api.calls]}
  return looped, private, trainer, history, result


def test_loop_steps_equal_fit_on_the_cpu_backend_and_a_fixed_batch_input_gets_the_caveat(
    tmp_path):
  fixed = _fixed_batches()
  looped, private, trainer, history, _ = _one_replica_loop()
  reference, _ = _private()
  reference.fit(fixed, verbose=0)
  for a, b in zip(looped.trainable_weights, reference.trainable_weights):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=0)
  # input_ids runs on each example alone: one that reverses the batch gives each example its
  # own ids, so exactly the steps of the model input's (one that gives wrong ids is refused:
  # test_input_ids_run_on_each_example_alone_and_a_wrong_one_is_refused).
  reversed_ids, reversed_private = _private(table_placement="host")
  TPUTrainer(reversed_private, input_ids=lambda x: {"ids": tf.reverse(x, [0])},
             api_factory=TPUEmbeddingAPIDouble).fit(fixed)
  for a, b in zip(looped.trainable_weights, reversed_ids.trainable_weights):
    np.testing.assert_array_equal(a, b)
  layer = looped.get_layer("ids")
  # Programs A and B (TPU programs on a TPU) never read or write the host table.
  for program in (trainer._program_a, trainer._program_b):
    used = variables_used(program)
    assert layer.embeddings.ref() not in used
    hidden = next(layer for layer in looped.layers if isinstance(layer, keras.layers.Dense))
    assert hidden.kernel.ref() in used or program is trainer._program_b
  np.testing.assert_array_equal(trainer.backend.table_rows(layer), layer.embeddings)
  assert trainer.engine.api.calls == STEP * 3 and len(history) == 3
  assert trainer.backend.name == "tpu-api-double"
  # The model's checkpoint holds the engine's tables and optimizer slots.
  looped.save_weights(str(tmp_path / "w"))
  saved = tf.train.load_checkpoint(str(tmp_path / "w"))
  for slot, variable in trainer.engine.slots("ids").items():
    key = "dp_state/embedding_engine/ids" + ("" if slot == "parameters" else f".S{slot}")
    np.testing.assert_array_equal(saved.get_tensor(key + "/.ATTRIBUTES/VARIABLE_VALUE"),
                                  variable.numpy(), err_msg=slot)
  # Not the package's Poisson sample: counted as such, the epsilon printed with the caveat.
  assert private.accountant.steps == 3 and not private.poisson_sampling
  assert NOT_POISSON in private.epsilon_text(private.epsilon())
  with pytest.raises(RuntimeError, match="DP steps only in .*TPUTrainer"):
    looped.fit(fixed, verbose=0)


def test_on_a_tpu_the_loop_refuses_tables_in_hbm_and_fit_refuses_host_tables(monkeypatch):
  """``on_tpu`` is a double here (no TPU): the refusals come before any program is built."""
  monkeypatch.setattr(embedding_backends, "on_tpu", lambda strategy: True)
  _, private = _private()
  with pytest.raises(ValueError, match="tables of ids are in every core's TensorCore HBM.*"
                                       "table_placement='host'"):
    TPUTrainer(private, api_factory=TPUEmbeddingAPIDouble)
  with pytest.raises(ValueError, match="tables of ids are on the host.*TPU programs cannot "
                                       "read.*table_placement='default_device'"):
    _private(table_placement="host")
  # On V1 hardware (a double here too) a host table is what the engine's loop takes.
  monkeypatch.setattr(hardware, "embedding_feature", lambda strategy: EmbeddingFeature.V1)
  TPUTrainer(_private("auto", table_placement="host")[1], api_factory=TPUEmbeddingAPIDouble)


def test_auto_on_v1_keeps_the_tables_in_the_engine_refuses_fit_and_the_loop_counts_poisson_steps(
    monkeypatch):
  """The V1 hardware is a double of ``tpu_hardware_feature.embedding_feature`` (no TPU here).
  The loop stops after ``steps`` and at the step limit, the one an epsilon budget sets
  (``max_steps_within_budget``)."""
  ids, labels = synthetic_data()
  monkeypatch.setattr(hardware, "embedding_feature", lambda strategy: EmbeddingFeature.V1)
  model, private = _private("auto")
  assert private.embedding_choice.name == "tpu"
  batches = private.poisson_dataset(ids, labels, epochs=0.2)  # 6 batches
  with pytest.raises(RuntimeError, match="DP steps only in .*TPUTrainer"):
    model.fit(batches, verbose=0)
  with pytest.raises(RuntimeError, match="DP steps only in .*TPUTrainer"):
    model.train_on_batch(ids[:128], labels[:128])
  trainer = TPUTrainer(private, api_factory=TPUEmbeddingAPIDouble)
  assert len(trainer.fit(batches, steps=1)) == 1 == private.accountant.steps
  # The engine keeps the table's Adam slots: Keras's optimizer made none for it.
  table = model.get_layer("ids").embeddings
  assert set(model.optimizer.get_slot_names()) == {"m", "v"}
  for name in model.optimizer.get_slot_names():
    with pytest.raises(KeyError):
      model.optimizer.get_slot(table, name)
  private.step_limit.assign(2)
  history = trainer.fit(private.poisson_dataset(ids, labels, epochs=0.2))  # 6 batches
  assert len(history) == 1 and private.accountant.steps == 2 and private.poisson_sampling
  epsilon = private.epsilon()
  assert private.epsilon_text(epsilon) == f"{epsilon:.4g}"  # no caveat
  assert trainer.engine.api.calls == STEP * 2


def test_a_program_with_a_second_dequeue_is_refused():
  _, private = _private()
  trainer = TPUTrainer(private, api_factory=TPUEmbeddingAPIDouble)
  second = tf.function(lambda: [trainer.engine.dequeue_round({}) for _ in range(2)])
  with pytest.raises(RuntimeError, match="should be unique within a function"):
    second()


def test_the_real_engine_is_refused_off_tpu_naming_the_alternatives():
  _, private = _private()
  with pytest.raises(ValueError, match="no TPU strategy: use 'cpu' .or 'engine-double'"):
    TPUTrainer(private)  # the real TPUEmbedding: a TPU with the V1 engine only


@pytest.mark.slow
@one_stack("tf2.15")  # with the two-replica run: CI's tf2.21 stack is the longer
def test_programs_a_and_b_compile_with_xla_and_take_the_graph_steps():
  ids, labels = synthetic_data()
  runs = []
  for jit_compile in (False, True):
    model, private = _private()
    trainer = TPUTrainer(private, api_factory=TPUEmbeddingAPIDouble, jit_compile=jit_compile)
    history = trainer.fit(private.poisson_dataset(ids, labels, epochs=0.1, padded=True))
    runs.append(([w.numpy() for w in model.trainable_weights], history))
  (graph, graph_history), (compiled, history) = runs
  for a, b in zip(graph, compiled):
    np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5)
  assert len(history) == len(graph_history) >= 3
  assert [h["nonzero_rows"] for h in history] == [h["nonzero_rows"] for h in graph_history]
  assert not any(key.startswith("sparse_dp_") for h in history for key in h)
  # Padded batches have one shape: more steps trace (and compile) program A no more.
  traced = trainer._program_a.experimental_get_tracing_count()
  trainer.fit(trainer.private.poisson_dataset(ids, labels, epochs=0.1, padded=True), steps=2)
  assert trainer.jit_compile and trainer._program_a.experimental_get_tracing_count() == traced


def test_an_example_reads_only_the_rows_of_the_ids_it_sent_the_engine():
  """Example 0 sent id 3 and example 1 id 5: example 0's lookup of 5 is missing (a NaN row,
  which zeroes its gradient) though the engine looked 5 up, so what it reads never depends
  on another example's ids. A search of the whole batch's ids read row 5 for it, and a
  neighbouring row for an id nobody sent, where XLA compiled the check away."""
  model, private = _private(table_placement="host")
  trainer = TPUTrainer(private, api_factory=TPUEmbeddingAPIDouble)
  backend, layer = trainer.backend, model.get_layer("ids")
  rows = tf.random.normal([2, 8])
  backend._tracing.round = {"ids": example_round(tf.constant([[3], [5]], tf.int64), rows)}

  def lookup():
    return backend._round_lookup(layer, tf.constant([3, 5], tf.int64))

  @tf.function(jit_compile=True)
  def read(position, in_a_branch):
    with recording(example=position):  # a tf.cond branch is a graph inside the scope's
      return tf.cond(in_a_branch, lookup, lookup) if in_a_branch is not None else lookup()

  try:
    for position, found in ((0, [True, False]), (1, [False, True]), (2, [False, False])):
      for in_a_branch in (None, tf.constant(True)):
        vectors, missing = read(tf.constant(position, tf.int64), in_a_branch)
        assert missing.numpy().tolist() == [not f for f in found]
        for i, f in enumerate(found):
          assert np.isnan(vectors[i]).all() != f
          if f:
            np.testing.assert_array_equal(vectors[i], rows[position])
    with pytest.raises(tf.errors.InvalidArgumentError, match="did not send the TPU embedding"):
      with recording(example=tf.constant(0, tf.int64)):  # outside XLA: refused at once
        backend._round_lookup(layer, tf.constant([5], tf.int64))
  finally:
    backend._tracing.round = None


@pytest.mark.parametrize("jit_compile", [False, True])
def test_input_ids_run_on_each_example_alone_and_a_wrong_one_is_refused(jit_compile):
  """``input_ids`` runs on each example alone: one that reverses the batch gives each
  example its own ids (the steps of the model input's, exactly: in graph mode only, where
  the trainings cost a third of the compiled ones, with the loop's steps in
  ``test_loop_steps_equal_fit_on_the_cpu_backend_and_a_fixed_batch_input_gets_the_caveat``),
  and one that gives other ids than the layer looks up is refused: in the step outside XLA,
  by the host guard under it (a lookup of the whole batch's ids would find most of them
  there)."""
  ids, labels = synthetic_data()
  batches = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(64).take(1)
  _, private = _private(table_placement="host")
  trainer = TPUTrainer(private, input_ids=lambda x: {"ids": (x + 1) % VOCAB},
                       api_factory=TPUEmbeddingAPIDouble, jit_compile=jit_compile)
  error = ValueError if jit_compile else tf.errors.InvalidArgumentError
  with pytest.raises(error, match="did not send the (TPU embedding )?engine"):
    trainer.fit(batches)
  with pytest.raises(ValueError, match="input_ids gives 2 ids of one example for table 'ids'"):
    TPUTrainer(private, input_ids=lambda x: {"ids": tf.stack([x, x], 1)},
               api_factory=TPUEmbeddingAPIDouble).fit(batches)


@pytest.mark.slow
def test_the_pctr_jobs_tables_train_in_the_loop_by_their_input_columns():
  """``--strategy tpu`` on V1 hardware trains the pCTR job by this loop, each table's ids
  being a column of one model input (``pctr.table_ids``; a layer looking up ids the host
  did not enqueue for it fails the step)."""
  rng = np.random.default_rng(0)
  x = {"integers": rng.random((128, 13)).astype("float32"),
       "categorical": rng.integers(0, 50, (128, 2)) + [0, 50]}  # no id in both columns
  batches = tf.data.Dataset.from_tensor_slices((x, rng.integers(0, 2, 128).astype("float32")))
  model = build_pctr_model([100, 100], hidden_units=(4,))
  model.compile(optimizer=keras.optimizers.Adam(0.01),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  private = sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", **ADAFEST),
                                   num_examples=N, batch_size=64, embedding="cpu")
  trainer = TPUTrainer(private, input_ids=table_ids, api_factory=TPUEmbeddingAPIDouble)
  history = trainer.fit(batches.batch(64))
  assert len(history) == 2 and all(h["nonzero_rows"] > 0 for h in history)


@pytest.mark.slow
@one_stack("tf2.15")  # an end-to-end run; its library code has unit tests on both stacks
def test_two_replicas_give_the_one_replica_steps_and_fits_tables():
  """On two mirrored CPU replicas each core enqueues the same selected rows with its own
  clipped share (noise on replica 0 only) and the API double sums the cores' gradients into
  the rows: the tables are one replica's and those of ``fit`` on the two replicas. Noise
  added on both replicas, or each core's share applied as an optimizer step of its own,
  would move the weights apart. The one-replica run is this process's (the subprocess's two
  runs take the same 3 batches), shared with the first test."""
  script = support.FOLDER / "mirrored_tpu_loop.py"
  done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  one, two, fit_two = _one_replica_loop()[-1], result["two"], result["fit_two"]  # one: here
  assert one["steps"] == two["steps"] == fit_two["steps"] == 3  # each step counted once
  assert two["nonzero_rows"] == one["nonzero_rows"]  # one selection, the whole batch's
  assert one["calls"] == [list(call) for call in STEP * 3]
  assert two["calls"] == [list(call) for call in STEP for _ in range(2)] * 3  # per core
  # The two-replica run's host table: one variable, on the host CPU; fit's is mirrored.
  assert two["table"]["copies"] == 1 and two["table"]["device"].endswith("/device:CPU:0")
  assert fit_two["table"]["copies"] == 2
  for a, b, c in zip(one["weights"], two["weights"], fit_two["weights"]):
    np.testing.assert_allclose(np.array(b), np.array(a), rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.array(b), np.array(c), rtol=0, atol=1e-6)
  # XLA cannot compile a MirroredStrategy's strategy.run as one program: refused, not obscure.
  assert result["xla_refusal"].startswith("TPUTrainer(jit_compile=True) on 2 replicas off TPU")


def test_one_real_engine_per_process_and_commands_that_would_make_two_are_refused_first(
    monkeypatch, tmp_path, capsys):
  """TF builds one ``TPUEmbedding`` per TPU system initialisation ('TPU is already initialized
  for embeddings'). V1 hardware, ``on_tpu`` and the real API are doubles here: a second
  ``TPUTrainer`` with the real engine is refused, and so are a ``--compare`` of two algorithms
  that would train in the engine (DP-SGD's auto backend is TPU variables) and a stream of two
  periods on V1, before any data is read."""
  monkeypatch.setattr(embedding_backends, "on_tpu", lambda strategy: True)
  monkeypatch.setattr(hardware, "embedding_feature", lambda strategy: EmbeddingFeature.V1)
  monkeypatch.setattr(tf.tpu.experimental.embedding, "TPUEmbedding", TPUEmbeddingAPIDouble)
  monkeypatch.setattr(tpu_loop, "_ENGINES_MADE", [])
  TPUTrainer(_private("auto", table_placement="host")[1])
  with pytest.raises(RuntimeError, match="already initialized for embeddings.*own process"):
    TPUTrainer(_private("auto", table_placement="host")[1])
  out = tmp_path / "out"
  commands = [["train", "--compare", "dpsgd,adafest,adafest+", "--out", str(out)],
              ["stream", "--train-days", "0-3", "--streaming-period", "2", "--state",
               str(tmp_path / "state")]]
  for command in commands:
    assert main(command) == 2
    assert "trains 2 private models: train each model in its own process" in (
        capsys.readouterr().err)
  assert not out.exists() and not (tmp_path / "state").exists()
