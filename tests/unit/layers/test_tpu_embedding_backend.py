"""DP-AdaFEST and DP-SGD through the TPU embedding API's terms equal the CPU backend.

The same model, data and seeds train with ``embedding="cpu"`` (Keras variables,
sparse optimizers) and ``embedding="engine-double"`` (the engine double: inference
lookups, the update fed back through the extra feature). Tolerances: SGD
bit-equal up to ``1e-6``; Adagrad ``1e-5`` (Keras's epsilon 1e-7 in the root);
Adam ``2e-5`` (same rule, other float order). Every step changes exactly the
selected rows of the engine (as many as the step's ``nonzero_rows``) and their
slots, never the dummy row.

``--embedding`` follows the TPU's embedding hardware (tested through a double
of ``strategy.extended.tpu_hardware_feature``, TF's ``HardwareFeature`` of each
``EmbeddingFeature``, and on real CPU strategies); the CLI refuses the engine
and ``--strategy tpu`` off TPU before it reads any data.
"""

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf.tpu import topology_pb2

import sparse_dp
from sparse_dp import keras
from sparse_dp.cli import main
from sparse_dp.layers import embedding_backends
from sparse_dp.optimizers import LazyAdam

from support.keras_models import VOCAB, N, functional_model, synthetic_data
from support.stacks import one_stack
from support.tiers import first_case_fast
from support.tpu_engine import ADAFEST, OPTIMIZERS, EngineRows


def _train(embedding, optimizer, algorithm="adafest", steps=6):
  ids, labels = synthetic_data()
  model = functional_model(optimizer=optimizer())
  noise = ADAFEST if algorithm == "adafest" else dict(noise_multiplier=0.8)
  private = sparse_dp.make_private(model, sparse_dp.DPConfig(algorithm, noise_seed=4, **noise),
                                   num_examples=N, batch_size=128, embedding=embedding)
  callbacks = [EngineRows(private.embedding_backend)] if embedding == "engine-double" else []
  model.fit(private.poisson_dataset(ids, labels).take(steps), verbose=0, callbacks=callbacks)
  return model, private, callbacks


@pytest.mark.parametrize("name", first_case_fast(sorted(OPTIMIZERS, key="sgd".__ne__),
                                                 sorted(OPTIMIZERS, key="sgd".__ne__)))
def test_adafest_steps_give_the_cpu_backends_tables(name):
  optimizer, tolerance = OPTIMIZERS[name]
  cpu, _, _ = _train("cpu", optimizer)
  tpu, private, (rows,) = _train("engine-double", optimizer)
  assert private.embedding_backend.name == "tpu-engine-double"
  for a, b in zip(cpu.trainable_weights, tpu.trainable_weights):
    np.testing.assert_allclose(a, b, atol=tolerance, rtol=0)
  engine_rows = private.embedding_backend.table_rows(tpu.get_layer("ids"))
  np.testing.assert_array_equal(engine_rows, tpu.get_layer("ids").embeddings)
  # Each step touches its selected rows only (a batch of 128 looks up more distinct
  # rows than tau lets through), never the dummy row VOCAB.
  assert [len(c) for c in rows.changed] == rows.selected and all(rows.selected)
  assert all(VOCAB not in c for c in rows.changed)
  if name == "adam":  # the engine's slots are the CPU optimizer's, row for row
    slots = private.embedding_backend.engine.slots("ids")
    variable = cpu.get_layer("ids").embeddings
    for engine_slot, keras_slot in (("momenta", "m"), ("velocities", "v")):
      np.testing.assert_allclose(slots[engine_slot].numpy()[:VOCAB],
                                 cpu.optimizer.get_slot(variable, keras_slot), atol=tolerance)


def test_dpsgd_dense_noise_goes_through_every_row():
  cpu, _, _ = _train("cpu", OPTIMIZERS["sgd"][0], "dpsgd", steps=3)
  tpu, private, (rows,) = _train("engine-double", OPTIMIZERS["sgd"][0], "dpsgd", steps=3)
  for a, b in zip(cpu.trainable_weights, tpu.trainable_weights):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  assert all(len(c) == VOCAB for c in rows.changed)


@pytest.mark.slow
def test_checkpoints_restore_across_backends(tmp_path):
  tpu, private, _ = _train("engine-double", OPTIMIZERS["adam"][0], steps=3)
  backend, layer = private.embedding_backend, tpu.get_layer("ids")
  # TPU-trained tables and slots, served on CPU through TPUEmbeddingForServing.
  path = tf.train.Checkpoint(embedding=backend.export_for_serving()).write(str(tmp_path / "e"))
  api = tf.tpu.experimental.embedding
  table = api.TableConfig(vocabulary_size=VOCAB, dim=8, combiner="sum", name="ids")
  serving = api.TPUEmbeddingForServing({"ids": api.FeatureConfig(table=table)}, api.Adam(0.01))
  tf.train.Checkpoint(embedding=serving).read(path).assert_existing_objects_matched()
  ids = tf.constant([0, 5, VOCAB - 1])
  np.testing.assert_array_equal(serving.embedding_lookup({"ids": ids})["ids"],
                                tf.gather(backend.table_rows(layer), ids))
  np.testing.assert_array_equal(serving._variables["ids"]["momenta"].numpy(),
                                backend.engine.slots("ids")["momenta"].numpy()[:VOCAB])
  # The Keras model (its tables kept equal to the engine's) restores on the CPU backend;
  # its checkpoint restarts the TPU backend's engine with the trained tables and the
  # engine's own Adam moments (saved with the model's DP state).
  tpu.save_weights(str(tmp_path / "w"))
  model = functional_model(optimizer=LazyAdam(0.01))  # the optimizer make_private made
  model.load_weights(str(tmp_path / "w"))
  again = sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", noise_seed=5, **ADAFEST),
                                 num_examples=N, batch_size=128, embedding="engine-double")
  np.testing.assert_array_equal(again.embedding_backend.table_rows(model.get_layer("ids")),
                                backend.table_rows(layer))
  trained = backend.engine.slots("ids")
  assert np.any(trained["momenta"].numpy() != 0)
  for slot, restored in again.embedding_backend.engine.slots("ids").items():
    np.testing.assert_array_equal(restored, trained[slot], err_msg=slot)


def test_refusals_name_the_input_and_the_fix():
  model = functional_model()
  with pytest.raises(ValueError, match="algorithm 'none' trains as plain Keras"):
    sparse_dp.make_private(model, sparse_dp.DPConfig("none"), num_examples=N, batch_size=128,
                           embedding="engine-double")
  with pytest.raises(ValueError, match="one of auto, tpu, cpu, engine-double, got 'gpu'"):
    sparse_dp.make_private(model, sparse_dp.DPConfig("none"), num_examples=N, batch_size=128,
                           embedding="gpu")
  model = functional_model(optimizer=keras.optimizers.SGD(0.1, momentum=0.9))
  with pytest.raises(ValueError, match="no engine optimizer for SGD"):
    sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", **ADAFEST), num_examples=N,
                           batch_size=128, embedding="engine-double")


@pytest.mark.slow
@one_stack("tf2.21")
def test_train_cli_auto_says_it_trains_with_cpu_off_tpu(tmp_path, capsys):
  # auto resolves to the cpu backend itself off TPU (test_off_tpu_auto_is_cpu_and_...)
  assert main(["train", "--max-examples", "200", "--batch-size", "64", "--hidden-units", "4",
               "--categorical-features", "2", "--noise-seed", "3",
               "--out", str(tmp_path / "auto"), "--json"]) == 0
  printed = capsys.readouterr()
  assert "sparse-dp: embedding auto -> cpu: no TPU strategy" in printed.err.splitlines()
  metrics = json.loads(printed.out)
  assert metrics["embedding"] == "cpu" and metrics["steps"] > 0


def _tpu_strategy_double(feature: str, replicas: int):
  """A ``TPUStrategy``'s one attribute the dispatch reads (no TPU here): its
  ``extended.tpu_hardware_feature``, TF's own ``HardwareFeature`` of the proto a TPU reports."""
  proto = topology_pb2.TPUHardwareFeature(
      embedding_feature=getattr(topology_pb2.TPUHardwareFeature.EmbeddingFeature, feature))
  extended = types.SimpleNamespace(
      tpu_hardware_feature=tf.tpu.experimental.HardwareFeature(proto))
  return types.SimpleNamespace(extended=extended, num_replicas_in_sync=replicas)


# TF 2.16+ has TPUEmbeddingV2 (SparseCore); TF 2.15 has none.
_V2 = (("sparsecore", None) if hasattr(tf.tpu.experimental.embedding, "TPUEmbeddingV2") else
       ("cpu", r"SparseCore \(V2\) engine \(v5p, v6e\), whose API TPUEmbeddingV2 is in TF "
               r"2\.16\+ \(this is TF .*\): use 'cpu' \(ordinary TPU variables\)"))


@pytest.mark.parametrize("feature, replicas, auto, refusal", [
    ("V1", 1, "tpu", None),
    ("V1", 8, "tpu", None),  # TPUTrainer runs every core (tests/mirrored_tpu_loop.py)
    ("V2", 8, *_V2),
    ("UNSUPPORTED", 8, "cpu", r"TPU without an embedding engine \(v5e\): use 'cpu'")])
def test_the_backend_follows_the_tpus_embedding_hardware(feature, replicas, auto, refusal):
  strategy = _tpu_strategy_double(feature, replicas)
  choice = embedding_backends.choose_backend("auto", strategy)
  assert choice.name == auto
  assert choice.describe("auto").startswith(f"embedding auto -> {auto}: ")
  if refusal is None:
    assert embedding_backends.choose_backend("tpu", strategy).name == auto
  else:
    with pytest.raises(ValueError, match=refusal):
      embedding_backends.choose_backend("tpu", strategy)
  assert embedding_backends.choose_backend("cpu", strategy).name == "cpu"
  with pytest.raises(ValueError, match="'engine-double' runs .* off TPU, for tests"):
    embedding_backends.choose_backend("engine-double", strategy)
  # DP-SGD noises every row each step: auto keeps its tables off the engine, which would move
  # all V ids and V x d gradients a step; asked for by name, the engine is what it gets.
  dense = embedding_backends.choose_backend("auto", strategy, noises_every_row=True)
  assert dense.name == "cpu"
  assert ("noises every row" in dense.reason) == (auto != "cpu")
  if refusal is None:
    assert embedding_backends.choose_backend("tpu", strategy, noises_every_row=True).name == auto


def test_sparse_cores_per_chip_is_the_hardwares_else_tpu_embedding_v2s_default():
  proto = topology_pb2.TPUHardwareFeature(num_embedding_devices_per_chip=2)
  strategy = types.SimpleNamespace(extended=types.SimpleNamespace(
      tpu_hardware_feature=tf.tpu.experimental.HardwareFeature(proto)))
  assert embedding_backends.hardware.sparse_cores_per_chip(strategy) == 2
  for unreported in (_tpu_strategy_double("V2", 1), tf.distribute.get_strategy()):
    assert embedding_backends.hardware.sparse_cores_per_chip(unreported) == 4


@pytest.mark.parametrize("strategy", [tf.distribute.get_strategy, tf.distribute.MirroredStrategy])
def test_off_tpu_auto_is_cpu_and_the_engine_is_refused_naming_the_double(strategy):
  strategy = strategy()
  assert embedding_backends.choose_backend("auto", strategy).describe("auto") == (
      "embedding auto -> cpu: no TPU strategy")
  with pytest.raises(ValueError, match="no TPU strategy: use 'cpu' .or 'engine-double' to "
                                       "test the engine's update off TPU"):
    embedding_backends.choose_backend("tpu", strategy)
  assert embedding_backends.choose_backend("engine-double", strategy).name == "engine-double"


def test_train_cli_refuses_the_engine_off_tpu_before_reading_data(tmp_path, capsys):
  out = tmp_path / "out"
  assert main(["train", "--embedding", "tpu", "--out", str(out)]) == 2
  error = capsys.readouterr().err
  assert "no TPU strategy: use 'cpu' (or 'engine-double'" in error and not out.exists()


def test_strategy_tpu_off_tpu_fails_in_one_line_before_training(tmp_path):
  """``sparse-dp train`` and ``stream --strategy tpu`` on this machine, which has no TPU."""
  script = ("import sys; from sparse_dp.cli import main\n"
            f"codes = [main(['train', '--strategy', 'tpu', '--out', {str(tmp_path / 'out')!r}]),\n"
            f"         main(['stream', '--strategy', 'tpu', '--state', {str(tmp_path / 's')!r}])]\n"
            "print(codes)")
  # cwd: not the checkout, whose sparse_dp/ (without the installed sparse_dp.models) would shadow
  # the installed package
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=300, cwd=tmp_path, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  assert done.stdout.strip() == "[2, 2]", done.stderr
  errors = [line for line in done.stderr.splitlines() if ": error: " in line]
  assert [line.split(":")[0] for line in errors] == ["sparse-dp train", "sparse-dp stream"]
  for line in errors:
    assert "--strategy tpu: no TPU found (--tpu 'local': TPUs not found in the cluster); " in line
    assert "or train with --strategy default (CPU or GPU)" in line
  assert not (tmp_path / "out").exists() and not (tmp_path / "s").exists()
