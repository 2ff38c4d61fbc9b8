"""A double of ``TPUEmbeddingV2``, the SparseCore (v5p, v6e) mid-level API, off TPU.

``tf.tpu.experimental.embedding.TPUEmbeddingV2`` (TF 2.16+,
``tensorflow/python/tpu/tpu_embedding_v3.py``, read at TF 2.21) refuses to be
created outside a ``TPUStrategy`` (``TPUEmbeddingV2.__init__``: "should be
created under TPUStrategy"). :class:`TPUEmbeddingV2APIDouble` takes its calls
with the rules of that file (function named at each below). Its tables are
laid out as on the SparseCores (:mod:`.sparse_core_layout`), by TF's own code,
which it runs on itself:

* ``__init__`` is ``TPUEmbeddingV2.__init__`` but for the strategy: the
  feature config cloned (``_clone_feature_config``), weight decay refused
  (``NotImplementedError``), ``SparseCoreEmbeddingConfig()`` when none is
  given, the tables padded and laid out by TF's ``SparseCoreLayoutStacker``
  (``_stack_tables_with_same_table_dim_and_optimizer``, for one replica and the
  strategy's SparseCores per chip), ``max_ids_per_table`` and
  ``max_unique_ids_per_table`` read by stacked table, 256 for one they do not
  name (``_update_sparse_core_buffer_size_after_table_stacking``);
* ``build`` creates each stacked table and its slots with the values TF's
  ``_initialize_stacked_table_for_device`` gives the one device (each table's
  initializer called with its ``shard_info``: ``_get_shard_info_for_table``,
  ``_wrap_initializer``), tracked under the API's checkpoint keys
  (``<stacked table>``, ``<stacked table>/<slot>``) with the layouts
  (``_track_restore_info_for_cpu``), so that a checkpoint of the double
  restores into ``TPUEmbeddingForServing`` as one of the API does;
* ``embedding_lookup(features)`` is ``enqueue`` then ``dequeue``
  (``embedding_lookup``), building on first use (``_maybe_build``): features
  of ``feature_config``'s structure (``enqueue``: ``nest.assert_same_structure``),
  each a dense tensor of its ``output_shape``'s sample count
  (``_convert_input_feature_to_list_of_coo_tensors``), every feature with an
  ``output_shape`` that is a multiple of the SparseCores per chip
  (``_unstack_activations`` and ``_stack_gradients`` cut each feature into one
  slice per SparseCore; the lookup kernel refuses "input_size ... not divisible
  by the number of sparsecores per chip"); each id reads the row of the
  variable the layout puts it in (``map_indices_in_shard``), without the
  padded columns (``_unstack_activations``); it returns the activations
  (``output_shape + [dim]`` per feature) and the ``preserved_outputs`` (by
  stacked table: what ``apply_gradients`` updates);
* the SparseCore bounds: one lookup may send a SparseCore at most
  ``max_ids_per_table`` ids and ``max_unique_ids_per_table`` distinct ids of a
  stacked table. Past them, with ``allow_id_dropping=False``, the double fails
  the lookup (the message is the double's);
* ``apply_gradients(gradients, preserved_outputs)``: refused before ``build``
  (its ``RuntimeError``); gradients of the structure, ``None`` a zero gradient,
  a non-tensor refused, each of its feature's ``output_shape + [dim]`` size
  (``_stack_gradients`` reshapes it to ``[-1, dim]``, pads the columns and
  slices it); each table's optimizer applied to the rows of the lookup whose
  ``preserved_outputs`` are given, gradients summed per row, by the update
  rules of :class:`~sparse_dp.layers.embedding_backends.doubles.engine_double.EngineDouble`,
  the SparseCore kernels' for SGD, Adagrad and Adam
  (``tensorflow/core/tpu/kernels/sparse_core_xla_ops.cc``: the optimizer is a
  per-row computation applied to the rows of the lookup's CSR; Adam's is
  ``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2``,
  ``w <- w - lr m / (sqrt(v + e1) + e2)`` with ``(e1, e2) = (eps^2, 0)`` under
  ``use_sum_inside_sqrt``, else ``(0, eps)``, no bias correction; lazy whatever
  ``lazy_adam`` says, which ``apply_gradients`` does not pass);
* no queue and no training flag: lookups and updates may be placed anywhere in
  a program, several of each ("lookup can be placed anywhere, multiple
  instances allowed" on V2 hardware); an update names its lookup by its
  ``preserved_outputs``.

Inside a program XLA compiles the bound checks compile away (as the V1 double's:
:func:`~sparse_dp.layers.embedding_backends.doubles.tpu_api_double._require`).

Not modelled (refused where a setting asks for it): table stacking
(``disable_table_stacking=True`` required), id dropping, pipelining
(``pipeline_execution_with_tensor_core``), FTRL and Adagrad with momentum,
sparse and ragged inputs, weights, quantization, several replicas (the
variables of several devices: :func:`.sparse_core_layout.initializer` is
tested against TF's own conversion for two), and the checks that need a TPU
replicate context (``_raise_error_for_incorrect_control_flow_context``: no
XLA control flow between ``strategy.run`` and a lookup). TF 2.15 has no
``tpu_embedding_v3``: this module is imported on TF 2.16+ only.
"""

from __future__ import annotations

# The double runs TF's own layout and initialization code (private to tpu_embedding_v3).
import functools
import operator

import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_base, tpu_embedding_v3
from tensorflow.python.util import nest  # the real API's nest (flatten_with_joined_string_paths)

from sparse_dp.layers.embedding_backends import sparse_core_layout
from sparse_dp.layers.embedding_backends.doubles.engine_double import apply_round, check_modelled
from sparse_dp.layers.embedding_backends.doubles.tpu_api_double import _require
from sparse_dp.layers.embedding_backends.hardware import sparse_cores_per_chip
from sparse_dp.mechanisms.rows import padding

_API = tf.tpu.experimental.embedding
_V2 = tpu_embedding_v3.TPUEmbeddingV2


def sample_count(feature) -> int:
  """The static number of ids a feature takes per lookup (its ``output_shape``'s size)."""
  return functools.reduce(operator.mul, feature.output_shape, 1)


class TPUEmbeddingV2APIDouble(tpu_embedding_base.TPUEmbeddingBase):
  """``embedding_lookup``/``apply_gradients``/``build`` of ``TPUEmbeddingV2``, off TPU.

  ``feature_config``: a flat ``{name: FeatureConfig}`` dict of dense univalent
  features, each with its ``output_shape``. Create on one replica.
  """

  backend_name = "tpu-sparsecore-api-double"

  # TF's own code for the layout, the buffers and the tables' initial values, run on the double.
  DEFAULT_MAX_IDS_PER_TABLE = _V2.DEFAULT_MAX_IDS_PER_TABLE
  DEFAULT_MAX_UNIQUE_IDS_PER_TABLE = _V2.DEFAULT_MAX_UNIQUE_IDS_PER_TABLE
  _update_sparse_core_buffer_size_after_table_stacking = (
      _V2._update_sparse_core_buffer_size_after_table_stacking)
  _wrap_initializer = _V2._wrap_initializer
  _get_shard_info_for_table = _V2._get_shard_info_for_table
  _initialize_stacked_table_for_device = _V2._initialize_stacked_table_for_device
  _track_restore_info_for_cpu = _V2._track_restore_info_for_cpu
  _maybe_build = _V2._maybe_build
  embedding_layouts = _V2.embedding_layouts
  variables = _V2.variables

  def __init__(self, feature_config, optimizer=None,
               pipeline_execution_with_tensor_core: bool = False,
               sparse_core_embedding_config=None):
    config = sparse_core_embedding_config or _API.SparseCoreEmbeddingConfig()
    unmodelled = {"pipeline_execution_with_tensor_core": pipeline_execution_with_tensor_core,
                  "allow_id_dropping": config.allow_id_dropping,
                  "disable_table_stacking=False": not config.disable_table_stacking}
    given = sorted(name for name, value in unmodelled.items() if value)
    if given:
      raise ValueError(f"TPUEmbeddingV2 double: {given} not modelled")
    strategy = tf.distribute.get_strategy()
    if strategy.num_replicas_in_sync != 1:
      raise ValueError("TPUEmbeddingV2 double: one replica is modelled; this strategy has "
                       f"{strategy.num_replicas_in_sync}")
    super().__init__(tpu_embedding_v3._clone_feature_config(feature_config), optimizer)
    for table in self._table_config:
      if (table.optimizer.weight_decay_factor is not None
          or table.optimizer.multiply_weight_decay_factor_by_learning_rate is not None):
        raise NotImplementedError(
            "weight_decay_factor and multiply_weight_decay_factor_by_learning_rate are not "
            f"supported yet. But found in table {table.name} setting.")
      check_modelled(table.optimizer)
    self._num_sc_per_chip = sparse_cores_per_chip(strategy)
    self._num_sc_shards = self._num_sc_per_chip  # one replica
    self._flat_features = nest.flatten_with_joined_string_paths(self._feature_config)
    for path, feature in self._flat_features:
      if not feature.output_shape:
        raise ValueError(f"TPUEmbeddingV2: feature {path} has no output_shape; the API sizes "
                         "its buffers from every feature's static shape when it is created")
      if sample_count(feature) % self._num_sc_per_chip:
        raise ValueError(f"TPUEmbeddingV2: feature {path} takes {sample_count(feature)} ids, "
                         "not divisible by the number of sparsecores per chip "
                         f"{self._num_sc_per_chip}")
    self._sparse_core_embedding_config = config
    self._s = tpu_embedding_v3._stack_tables_with_same_table_dim_and_optimizer(
        self._table_config, self._flat_features, 1, self._num_sc_per_chip, config)
    self._stacked_table_to_tables = self._s.stacked_table_to_tables
    self._table_to_padding_columns = self._s.table_to_padding_columns
    self._table_to_max_ids_per_sparse_core = {}
    self._table_to_max_unique_ids_per_sparse_core = {}
    self._update_sparse_core_buffer_size_after_table_stacking()

  def _stack_of(self, feature) -> str:
    return self.embedding_layouts[feature.table.name].stacked_table_name

  def build(self) -> None:
    """Each stacked table and its slots, as ``TPUEmbeddingV2.build`` makes them on one device."""
    if self._built:
      return
    self._variables = {}
    for stacked, tables in self._stacked_table_to_tables.items():
      values = self._initialize_stacked_table_for_device(tables, 0, 1)
      names = {slot: stacked if slot == "parameters" else f"{stacked}/{slot}" for slot in values}
      self._variables[stacked] = {
          slot: self._track_trackable(tf.Variable(value, trainable=False, name=names[slot]),
                                      names[slot])
          for slot, value in values.items()}
    self._track_restore_info_for_cpu()
    self._built = True

  def embedding_lookup(self, features, weights=None) -> tuple:
    """``(activations, preserved_outputs)`` of one lookup (changes nothing)."""
    if weights is not None:
      raise ValueError("TPUEmbeddingV2 double: weights are not modelled")
    self._maybe_build()
    nest.assert_same_structure(self._feature_config, features)
    rows = {}
    for (path, feature), given in zip(self._flat_features, nest.flatten(features)):
      if not isinstance(given, tf.Tensor):
        raise ValueError(f"Input {path} is of type {type(given)}: the double models dense "
                         "tf.Tensor ids only")
      if given.shape.num_elements() != sample_count(feature):
        raise ValueError(f"feature {path} takes {sample_count(feature)} ids (output_shape "
                         f"{list(feature.output_shape)}), got a tensor of shape {given.shape}")
      ids = tf.reshape(tf.cast(given, tf.int32), [-1])
      rows[path] = sparse_core_layout.variable_rows(
          self.embedding_layouts[feature.table.name], ids)
    preserved = {}
    for stacked in self._stacked_table_to_tables:
      paths = [p for p, f in self._flat_features if self._stack_of(f) == stacked]
      with tf.control_dependencies(self._fits_sparse_cores(stacked, [rows[p] for p in paths])):
        preserved[stacked] = {p: tf.identity(rows[p]) for p in paths}
    activations = []
    for path, feature in self._flat_features:
      stacked = self._stack_of(feature)
      width = feature.table.dim - self._table_to_padding_columns[feature.table.name]
      looked_up = tf.gather(self._variables[stacked]["parameters"], preserved[stacked][path])
      activations.append(tf.reshape(looked_up[:, :width], list(feature.output_shape) + [width]))
    return nest.pack_sequence_as(self._feature_config, activations), preserved

  def apply_gradients(self, gradients, preserved_outputs: dict) -> None:
    """Each table's optimizer on the rows of the lookup ``preserved_outputs`` came from."""
    if not self._built:
      raise RuntimeError("apply_gradients called on unbuilt TPUEmbeddingV2 object. Please "
                         "either call the embedding lookup method first or manually call the "
                         "build method.")
    nest.assert_same_structure(self._feature_config, gradients)
    padded = {}
    for (path, feature), gradient in zip(self._flat_features, nest.flatten(gradients)):
      extra = self._table_to_padding_columns[feature.table.name]
      full = list(feature.output_shape) + [feature.table.dim - extra]
      if gradient is None:
        gradient = tf.zeros(full)
      elif not isinstance(gradient, tf.Tensor):
        raise ValueError(f"found non-tensor type: {type(gradient)} at path {path}.")
      elif gradient.shape.num_elements() != sample_count(feature) * full[-1]:
        raise ValueError(f"Found gradient of shape {gradient.shape} at path {path}; "
                         f"expected {full}.")
      padded[path] = tf.pad(tf.reshape(gradient, [-1, full[-1]]), [[0, 0], [0, extra]])
    missing = sorted(set(self._stacked_table_to_tables) - set(preserved_outputs))
    if missing:
      raise ValueError(f"preserved_outputs holds no lookup of tables {missing}: pass the "
                       "second output of the embedding_lookup whose rows to update")
    for stacked, tables in self._stacked_table_to_tables.items():
      paths = list(preserved_outputs[stacked])
      apply_round(tables[0].optimizer, self._variables[stacked],
                  tf.concat([preserved_outputs[stacked][p] for p in paths], 0),
                  tf.concat([padded[p] for p in paths], 0))

  def _fits_sparse_cores(self, stacked: str, rows: list) -> list:
    """Checks that no SparseCore gets more ids, or distinct ids, of ``stacked`` than its bounds."""
    rows = tf.cast(tf.concat(rows, 0), tf.int64)
    shard_rows = self._stacked_table_to_tables[stacked][0].layout.total_rows_per_sparse_core_shard

    def most_on_one_core(rows):  # PAD (the padding of a unique) counts on none
      core = tf.where(padding.is_valid(rows), rows // shard_rows, -1)
      return tf.reduce_max(tf.reduce_sum(tf.one_hot(core, self._num_sc_shards, dtype=tf.int32), 0))

    most, most_unique = most_on_one_core(rows), most_on_one_core(padding.padded_unique(rows).values)
    most_ids = self._table_to_max_ids_per_sparse_core[stacked]
    most_unique_ids = self._table_to_max_unique_ids_per_sparse_core[stacked]
    limit = (f"with allow_id_dropping=False a lookup fails past them (rows are sharded mod "
             f"{self._num_sc_shards} SparseCores)")
    return (_require(most <= most_ids,
                     f"a lookup sent more than max_ids_per_table[{stacked!r}] = {most_ids} ids "
                     f"of table {stacked} to one SparseCore; {limit}")
            + _require(most_unique <= most_unique_ids,
                       f"a lookup sent more than max_unique_ids_per_table[{stacked!r}] = "
                       f"{most_unique_ids} distinct ids of table {stacked} to one SparseCore; "
                       f"{limit}"))
