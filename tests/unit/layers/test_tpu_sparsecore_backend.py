"""DP-AdaFEST through ``TPUEmbeddingV2`` (SparseCore) in one Keras step, through its double.

:class:`TPUEmbeddingV2APIDouble` takes ``embedding_lookup``/``apply_gradients``
with the rules of TF 2.21's ``tpu_embedding_v3.py``; :class:`SparseCoreBackend`
applies the DP step's update inside the step ``fit`` traces (a lookup of the
batch's ids for the forward pass, a lookup of the selected rows,
``apply_gradients`` with its preserved outputs). DP-AdaFEST steps with host
tables give the CPU backend's tables (tolerances as in
``test_tpu_embedding_backend.py``), read and write no Keras table, and change
exactly the selected rows of the engine. The double's tables are in the SparseCore layout,
made by TF's own stacker and initialization code: the engine's initial table is
TF's CPU -> SparseCore conversion of the layer's rows, and the host copy and a
checkpoint restored into ``TPUEmbeddingForServing`` give the rows back.
``TPUEmbeddingV2`` is in TF 2.16+: on the TF 2.15 stack these tests skip.
"""

import numpy as np
import pytest
import tensorflow as tf

v3 = pytest.importorskip("tensorflow.python.tpu.tpu_embedding_v3", reason=(
    "TPUEmbeddingV2 (tensorflow/python/tpu/tpu_embedding_v3.py) is in TF 2.16+; this stack's "
    "TF has none (the TF 2.21 stack runs these tests)"))


# These need TF 2.16+ (the adapter; the double imports tpu_embedding_v3): after the skip.
from tensorflow.python.tpu import tpu_embedding_v3_checkpoint_adapter as adapter  # noqa: E402
from tensorflow.python.tpu import tpu_replication  # noqa: E402
from tensorflow.python.trackable.base import ShardInfo  # noqa: E402

import sparse_dp  # noqa: E402
from sparse_dp.layers import embedding_backends  # noqa: E402
from sparse_dp.layers.embedding_backends import EmbeddingFeature, hardware, sparse_core_layout  # noqa: E402
from sparse_dp.layers.embedding_backends.doubles.sparsecore_api_double import (  # noqa: E402
  TPUEmbeddingV2APIDouble,
)
from sparse_dp.layers.embedding_backends.sparsecore import SparseCoreBackend, SparseCoreEngine  # noqa: E402
from sparse_dp.models.pctr import NUM_INTEGER, build_pctr_model, table_ids  # noqa: E402
from sparse_dp.training.dp_step.input_ids import (  # noqa: E402
  functional_input_ids,
  per_example_input_ids,
)
from sparse_dp.training.tpu_loop import TPUTrainer  # noqa: E402
from sparse_dp.training.wrappers.entry_point import update_bounds  # noqa: E402

from support.keras_models import VOCAB, N, functional_model, synthetic_data  # noqa: E402
from support.stacks import one_stack  # noqa: E402
from support.tiers import first_case_fast  # noqa: E402
from support.tpu_engine import ADAFEST, OPTIMIZERS, EngineRows, variables_used  # noqa: E402

# Collected on the TF 2.21 stack only: its slow tests run there.
pytestmark = one_stack("tf2.21")

API = tf.tpu.experimental.embedding
D = 4


def _private(optimizer, engine=True, jit_compile=False, algorithm="adafest", embedding="cpu",
             table_placement="default_device", **settings):
  ids, labels = synthetic_data()
  model = functional_model(optimizer=optimizer(), table_placement=table_placement)
  noise = ADAFEST if algorithm == "adafest" else dict(noise_multiplier=0.8)
  private = sparse_dp.make_private(model, sparse_dp.DPConfig(algorithm, noise_seed=4, **noise),
                                   num_examples=N, batch_size=128, embedding=embedding)
  if engine:
    layer = model.get_layer("ids")
    bounds = update_bounds([layer], private.step_noise, N, 128)
    private.use_embedding_backend(SparseCoreBackend(
        [layer], model.optimizer, bounds, {layer: private.largest_batch},
        per_example_input_ids(functional_input_ids(model, [layer]), [layer]),
        api_factory=TPUEmbeddingV2APIDouble, **settings))
  model._jit_compile = jit_compile
  return model, private, private.poisson_dataset(ids, labels)


@pytest.mark.parametrize("name", first_case_fast(sorted(OPTIMIZERS, key="sgd".__ne__),
                                                 sorted(OPTIMIZERS, key="sgd".__ne__)))
def test_adafest_steps_in_one_program_give_the_cpu_backends_tables(name):
  """The Keras table on the host (``table_placement='host'``): the step looks the batch up
  in the engine and reads and writes no table variable; ``fit`` copies the engine's rows
  into the Keras table when it ends."""
  optimizer, tolerance = OPTIMIZERS[name]
  cpu, _, data = _private(optimizer, engine=False)
  cpu.fit(data.take(4), verbose=0)
  model, private, data = _private(optimizer, table_placement="host")
  backend = private.embedding_backend
  rows = EngineRows(backend)
  model.fit(data.take(4), verbose=0, callbacks=[rows])
  assert backend.name == "tpu-sparsecore-api-double"
  for a, b in zip(cpu.trainable_weights, model.trainable_weights):
    np.testing.assert_allclose(a, b, atol=tolerance, rtol=0)
  layer = model.get_layer("ids")
  np.testing.assert_array_equal(backend.table_rows(layer), layer.embeddings)
  used = variables_used(model.train_function)
  assert layer.embeddings.ref() not in used
  assert model.layers[-1].kernel.ref() in used
  assert [len(c) for c in rows.changed] == rows.selected and all(rows.selected)
  assert all(VOCAB not in c for c in rows.changed)  # the dummy row never moves


def test_an_empty_batch_steps_in_graph_mode():
  """A Poisson batch may be empty: its per-example map runs one discarded spare example,
  which has no part of the engine's lookup and must not trip the step's check of the ids."""
  model, private, _ = _private(OPTIMIZERS["sgd"][0])
  ids, labels = synthetic_data()
  batches = tf.data.Dataset.from_tensors((ids[:0], labels[:0])).concatenate(
      tf.data.Dataset.from_tensors((ids[:64], labels[:64])))
  model.fit(batches, verbose=0)
  assert int(private.steps_taken.numpy()) == 2


@pytest.mark.slow
def test_one_compiled_step_holds_the_lookups_and_the_update():
  """``jit_compile=True``, as a TPU compiles the step: the same tables as the CPU backend's."""
  optimizer, tolerance = OPTIMIZERS["sgd"]
  cpu, _, data = _private(optimizer, engine=False)
  cpu.fit(data.take(2), verbose=0)
  model, private, data = _private(optimizer, jit_compile=True)
  model.fit(data.take(2), verbose=0)
  for a, b in zip(cpu.trainable_weights, model.trainable_weights):
    np.testing.assert_allclose(a, b, atol=tolerance, rtol=0)


def test_dpsgd_dense_noise_goes_through_every_row():
  """DP-SGD: the update feature carries all V rows (a lookup of V + 4 ids fits one SparseCore)."""
  optimizer = OPTIMIZERS["sgd"][0]
  cpu, _, data = _private(optimizer, engine=False, algorithm="dpsgd")
  cpu.fit(data.take(2), verbose=0)
  model, private, data = _private(optimizer, algorithm="dpsgd")
  rows = EngineRows(private.embedding_backend)
  model.fit(data.take(2), verbose=0, callbacks=[rows])
  for a, b in zip(cpu.trainable_weights, model.trainable_weights):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  assert all(len(c) == VOCAB for c in rows.changed)


def _table_features(sizes=None, optimizer=None):
  table = API.TableConfig(vocabulary_size=11, dim=D, combiner="sum", name="t",
                          initializer=lambda shape, dtype=tf.float32: tf.reshape(
                              tf.range(np.prod(shape), dtype=dtype), shape))
  sizes = sizes or {"a": 4, "b": 8}
  return {n: API.FeatureConfig(table=table, output_shape=[s], name=n)
          for n, s in sizes.items()}, optimizer or API.SGD(0.5)


def _config(**settings):
  return API.SparseCoreEmbeddingConfig(disable_table_stacking=True, **settings)


def test_the_double_keeps_the_call_rules_of_tpu_embedding_v3():
  api = TPUEmbeddingV2APIDouble(*_table_features(), sparse_core_embedding_config=_config())
  with pytest.raises(RuntimeError, match="apply_gradients called on unbuilt TPUEmbeddingV2"):
    api.apply_gradients({"a": None, "b": None}, {})
  ids = {"a": tf.constant([1, 2, 3, 3]), "b": tf.constant([5] * 8)}
  with pytest.raises(ValueError, match="feature b takes 8 ids"):
    api.embedding_lookup({"a": ids["a"], "b": tf.constant([5] * 4)})
  with pytest.raises((ValueError, TypeError), match="structure"):
    api.embedding_lookup({"a": ids["a"]})
  layout = api.embedding_layouts["t"]
  def rows():
    return sparse_core_layout.host_rows(api.variables["t"]["parameters"], layout).numpy()

  before = rows()

  @tf.function
  def two_lookups_one_update():  # V2 allows several lookups in one program
    first, preserved = api.embedding_lookup(ids)
    api.embedding_lookup({"a": tf.constant([7] * 4), "b": tf.constant([8] * 8)})
    api.apply_gradients({"a": tf.ones([4, D]), "b": None}, preserved)
    return first

  np.testing.assert_array_equal(two_lookups_one_update()["a"], before[[1, 2, 3, 3]])
  expected = np.zeros_like(before)
  expected[[1, 2]], expected[3] = 0.5, 1.0  # SGD(0.5), gradients summed per row
  # The rows of the lookup whose preserved outputs were given, and no other (not 7, 8).
  np.testing.assert_array_equal(before - rows(), expected)
  _, preserved = api.embedding_lookup(ids)
  with pytest.raises(ValueError, match="found non-tensor type"):
    api.apply_gradients({"a": np.ones([4, D]), "b": None}, preserved)
  with pytest.raises(ValueError, match=r"gradient of shape \(2, 4\) at path a"):
    api.apply_gradients({"a": tf.ones([2, D]), "b": None}, preserved)
  with pytest.raises(ValueError, match="not divisible by the number of sparsecores per chip 4"):
    TPUEmbeddingV2APIDouble(*_table_features({"a": 6}), sparse_core_embedding_config=_config())
  with pytest.raises(ValueError, match="allow_id_dropping"):
    TPUEmbeddingV2APIDouble(*_table_features(), sparse_core_embedding_config=_config(
        allow_id_dropping=True))


def _on_sparse_core_hardware(monkeypatch):
  """V2 hardware (``tpu_hardware_feature.embedding_feature``), ``TPUEmbeddingV2`` and
  ``on_tpu``, doubles here (no TPU)."""
  monkeypatch.setattr(hardware, "embedding_feature", lambda strategy: EmbeddingFeature.V2)
  monkeypatch.setattr(API, "TPUEmbeddingV2", TPUEmbeddingV2APIDouble)
  monkeypatch.setattr(embedding_backends, "on_tpu", lambda strategy: True)


def test_tables_that_read_columns_of_one_input_train_with_the_input_ids_given(monkeypatch):
  """The pCTR model's table ``i`` reads column ``i`` of ``categorical``, no model input of
  its own: on SparseCore hardware ``make_private`` refuses it without ``input_ids=`` and
  trains it with ``input_ids=table_ids``, as ``sparse-dp train --strategy tpu`` passes."""
  _on_sparse_core_hardware(monkeypatch)
  sizes, n = [16, 24, 8], 512

  def private_pctr(**input_ids):
    model = build_pctr_model(sizes, [8], table_placement="host")
    model.compile(optimizer=sparse_dp.keras.optimizers.legacy.SGD(0.1),
                  loss=sparse_dp.keras.losses.BinaryCrossentropy(from_logits=True))
    return model, sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", **ADAFEST),
                                         num_examples=n, batch_size=64, **input_ids)

  with pytest.raises(ValueError, match="embedding_0 is not called once directly on a model "
                                       "input.*input_ids="):
    private_pctr()
  model, private = private_pctr(input_ids=table_ids)
  assert private.embedding_backend.name == "tpu-sparsecore-api-double"
  rng = np.random.default_rng(0)
  x = {"integers": rng.normal(size=(n, NUM_INTEGER)).astype(np.float32),
       "categorical": np.stack([rng.integers(0, size, n) for size in sizes], 1)}
  model.fit(private.poisson_dataset(x, rng.integers(0, 2, n).astype(np.float32)).take(2),
            verbose=0)
  assert int(private.steps_taken.numpy()) == 2


def _traced_in_a_replicate_context(body):
  """Traces ``body`` as ``strategy.run`` traces a replica's program on a TPU: inside a
  ``TPUReplicateContext`` of a function's graph (TF allows it off TPU; nothing runs)."""
  @tf.function
  def program():
    context = tpu_replication.TPUReplicateContext(b"replicate", num_replicas=1,
                                                  pivot=tf.no_op())
    context.Enter()
    try:
      return body()
    finally:
      context.Exit()

  return program.get_concrete_function()


def test_the_double_refuses_a_lookup_nested_in_strategy_run_as_tf_does():
  """TF's own control-flow check: a lookup traced straight in the replica's program is
  allowed; in a function nested in it (Keras's ``jit_compile=True`` step) it is refused."""
  api = TPUEmbeddingV2APIDouble(*_table_features(), sparse_core_embedding_config=_config())
  api.build()
  ids = {"a": tf.constant([1, 2, 3, 3]), "b": tf.constant([5] * 8)}
  _traced_in_a_replicate_context(lambda: api.embedding_lookup(ids)[0]["a"])
  nested = tf.function(lambda: api.embedding_lookup(ids)[0]["a"], jit_compile=True)
  with pytest.raises(RuntimeError, match="does not match graph which contains "
                                         "TPUReplicateContext"):
    _traced_in_a_replicate_context(nested)


def test_the_double_fails_a_lookup_past_a_sparse_cores_bounds():
  """Rows are sharded mod 4 SparseCores here: 0, 4 and 8 land on the same one."""
  api = TPUEmbeddingV2APIDouble(*_table_features(), sparse_core_embedding_config=_config(
      max_ids_per_table={"t": 8}, max_unique_ids_per_table={"t": 2}))
  api.embedding_lookup({"a": tf.constant([0, 4, 1, 2]), "b": tf.constant([1, 2, 3] * 2 + [5] * 2)})
  with pytest.raises(RuntimeError, match=r"more than max_unique_ids_per_table\['t'\] = 2 "):
    api.embedding_lookup({"a": tf.constant([0, 4, 8, 1]),
                          "b": tf.constant([1, 2, 3, 5, 6, 7, 9, 10])})
  with pytest.raises(RuntimeError, match=r"more than max_ids_per_table\['t'\] = 8 ids"):
    api.embedding_lookup({"a": tf.constant([0, 4, 4, 4]), "b": tf.constant([0] * 8)})


def test_the_backend_sizes_the_sparse_cores_and_refuses_settings_that_break_dp():
  optimizer = OPTIMIZERS["adam"][0]
  model, private, _ = _private(optimizer)
  layer, engine = model.get_layer("ids"), private.embedding_backend.engine
  update = private.embedding_backend.update_bounds[layer]
  # Every feature a multiple of 4 SparseCores; each lookup's ids fit one SparseCore.
  assert engine.input_bounds == {"ids": -(-private.largest_batch // 4) * 4,
                                 "ids/dp_update": -(-update // 4) * 4}
  assert engine.api._table_to_max_ids_per_sparse_core == {"ids": sum(engine.input_bounds.values())}
  with pytest.raises(ValueError, match=r"allow_id_dropping=True\): a dropped id .* pass "
                                       r"allow_id_dropping=False"):
    _private(optimizer, sparse_core_config=API.SparseCoreEmbeddingConfig(allow_id_dropping=True))
  with pytest.raises(ValueError, match=r"max_unique_ids_per_table=\{'ids': 256\}\) is below the "
                                       r"\d+ ids .* raise it to at least \d+"):
    _private(optimizer, sparse_core_config=API.SparseCoreEmbeddingConfig(
        max_unique_ids_per_table={"ids": 256}))
  # An input_ids run on the batch as a whole: row i might not be example i's ids alone.
  with pytest.raises(ValueError, match=r"pass input_ids=per_example_input_ids\(input_ids"):
    SparseCoreBackend([layer], model.optimizer, {layer: update}, {layer: private.largest_batch},
                      functional_input_ids(model, [layer]), api_factory=TPUEmbeddingV2APIDouble)


def test_the_real_api_object_refuses_to_be_made_off_tpu():
  with pytest.raises(RuntimeError, match="TPUEmbeddingV2 should be created under TPUStrategy"):
    SparseCoreEngine(*_table_features(), {"a": 4, "b": 8})


def test_the_engine_holds_the_layers_rows_in_the_sparse_core_layout():
  """The engine table starts as TF's own CPU -> SparseCore conversion of the layer's rows and
  the dummy row (``_shard_from_cpu_to_sc``, which a restore onto SparseCores runs); lookups
  and the host copy give the layer's rows back."""
  model, private, _ = _private(OPTIMIZERS["adam"][0])
  layer, backend = model.get_layer("ids"), private.embedding_backend
  layout = backend.engine.api.embedding_layouts["ids"]
  variable = backend.engine.api.variables[layout.stacked_table_name]["parameters"]
  logical = np.concatenate([layer.embeddings.numpy(), np.zeros([1, 8], np.float32)])
  shape = variable.shape.as_list()
  assert layout.num_sparse_cores == 4 and shape[0] > VOCAB + 1  # padded
  expected = adapter._shard_from_cpu_to_sc(
      [logical], adapter._shard_info_str(shape, ShardInfo(shape, [0, 0])), [layout])
  np.testing.assert_array_equal(variable, expected)
  assert not np.array_equal(variable[:VOCAB + 1], logical)  # the rows' order is not the table's
  np.testing.assert_array_equal(backend.table_rows(layer), layer.embeddings)
  ids = tf.constant([0, 1, 5, VOCAB - 1, VOCAB])
  np.testing.assert_array_equal(
      backend.engine.lookup({"ids/dp_update": ids})["ids/dp_update"], logical[ids.numpy()])


class _Devices:
  """The state ``TPUEmbeddingV2``'s per-device initialization reads: 4 SparseCores per chip."""

  _wrap_initializer = v3.TPUEmbeddingV2._wrap_initializer
  _get_shard_info_for_table = v3.TPUEmbeddingV2._get_shard_info_for_table
  _initialize_stacked_table_for_device = v3.TPUEmbeddingV2._initialize_stacked_table_for_device

  def __init__(self, stacking):
    self._num_sc_per_chip, self._s = 4, stacking


@pytest.mark.parametrize("devices", [1, 2])
def test_each_devices_initial_rows_are_tfs_conversion_of_the_tables_rows(devices):
  """Two tables stacked on ``devices`` TPU devices (so shifted and rotated by TF's stacker):
  TF's ``_initialize_stacked_table_for_device`` asks the initializer for each device's rows,
  which are TF's own conversion of the rows, and ``host_rows`` gives the rows back."""
  rows = {"a": np.arange(13 * 3, dtype=np.float32).reshape(13, 3),
          "b": -np.arange(29 * 3, dtype=np.float32).reshape(29, 3)}
  tables = [API.TableConfig(vocabulary_size=len(r), dim=3, name=n, combiner="sum",
                            initializer=sparse_core_layout.initializer(
                                lambda dtype, r=r: tf.constant(r, dtype), 4 * devices, n))
            for n, r in rows.items()]
  features = [(t.name, API.FeatureConfig(table=t, output_shape=[8], name=t.name)) for t in tables]
  stacking = v3._stack_tables_with_same_table_dim_and_optimizer(
      tables, features, devices, 4, API.SparseCoreEmbeddingConfig())
  layouts = [stacking.table_to_layout[t.name] for t in tables]
  assert len(stacking.stacked_table_to_tables) == 1 and layouts[1].sparse_core_shard_row_offset
  assert layouts[1].sparse_core_shard_rotation == (0 if devices == 1 else 4)
  stacked = tf.concat([_Devices(stacking)._initialize_stacked_table_for_device(
      tables, device, devices)["parameters"] for device in range(devices)], 0)
  shape = stacked.shape.as_list()
  expected = adapter._shard_from_cpu_to_sc(
      list(rows.values()), adapter._shard_info_str(shape, ShardInfo(shape, [0, 0])), layouts)
  np.testing.assert_array_equal(stacked, expected)
  for layout, table_rows in zip(layouts, rows.values()):
    np.testing.assert_array_equal(sparse_core_layout.host_rows(stacked, layout), table_rows)
  with pytest.raises(ValueError, match=r"table a \(13 x 3\) does not fit the padded shape "
                                       r"\[8, 8\]"):
    tables[0].initializer((8, 8), tf.float32, ShardInfo([8, 8], [0, 0]))


@pytest.mark.slow
def test_a_checkpoint_of_the_engine_restores_into_tpu_embedding_for_serving(tmp_path):
  """TF's own SparseCore -> CPU path (the layouts saved with the tables, undone on restore)
  gives the backend's host copy after DP steps, and so does ``export_for_serving``
  (Adam's moments too)."""
  model, private, data = _private(OPTIMIZERS["adam"][0])
  model.fit(data.take(2), verbose=0)
  backend, layer = private.embedding_backend, model.get_layer("ids")
  path = tf.train.Checkpoint(embedding=backend.checkpointable).write(str(tmp_path / "e"))
  table = API.TableConfig(vocabulary_size=VOCAB + 1, dim=8, name="ids", combiner="sum")
  serving = API.TPUEmbeddingForServing({"ids": API.FeatureConfig(table=table)}, optimizer=None)
  tf.train.Checkpoint(embedding=serving).restore(path)
  serving.build()
  np.testing.assert_array_equal(serving.embedding_tables[table][:VOCAB],
                                backend.table_rows(layer))
  np.testing.assert_array_equal(backend.table_rows(layer), layer.embeddings)
  exported = backend.export_for_serving()._variables["ids"]
  layout = backend.engine.api.embedding_layouts["ids"]
  for slot, variable in backend.engine.api.variables["ids"].items():
    host = adapter._unshard_from_sc_to_cpu(variable, [layout])[0]
    np.testing.assert_array_equal(exported[slot], host[:VOCAB], err_msg=slot)
  assert set(exported) == {"parameters", "momenta", "velocities"}


@pytest.mark.slow
def test_on_sparse_core_hardware_auto_trains_in_fit_through_the_engine(monkeypatch):
  """V2 hardware is a double of ``tpu_hardware_feature.embedding_feature``, and the API
  ``TPUEmbeddingV2``'s double (no TPU here): ``auto`` takes the SparseCore backend, and
  DP-AdaFEST steps in ``fit`` give the CPU backend's tables; ``TPUTrainer`` is refused."""
  optimizer, tolerance = OPTIMIZERS["adam"]
  cpu, _, data = _private(optimizer, engine=False)
  cpu.fit(data.take(3), verbose=0)
  _on_sparse_core_hardware(monkeypatch)  # on a TPU host tables are what the engine takes
  model, private, data = _private(optimizer, engine=False, embedding="auto",
                                  table_placement="host")
  assert private.embedding_choice.describe("auto").startswith(
      "embedding auto -> sparsecore: TPU with the SparseCore (V2) embedding engine")
  assert private.embedding_backend.name == "tpu-sparsecore-api-double"
  model.fit(data.take(3), verbose=0)
  for a, b in zip(cpu.trainable_weights, model.trainable_weights):
    np.testing.assert_allclose(a, b, atol=tolerance, rtol=0)
  ids, labels = synthetic_data(seed=1)
  model.train_on_batch(ids[:128], labels[:128])  # the host table is the engine's after it
  layer = model.get_layer("ids")
  np.testing.assert_array_equal(private.embedding_backend.table_rows(layer), layer.embeddings)
  with pytest.raises(ValueError, match="TPUTrainer trains tables in the V1 TPU embedding "
                                       "engine; this is a TPU with the SparseCore"):
    TPUTrainer(private)
