"""A double of ``TPUEmbeddingV2``, the SparseCore (v5p, v6e) mid-level API, off TPU.

``tf.tpu.experimental.embedding.TPUEmbeddingV2`` (TF 2.16+, ``tpu_embedding_v3.py``, read at
TF 2.21) refuses to be created outside a ``TPUStrategy``. :class:`TPUEmbeddingV2APIDouble`
takes its calls (``build``, ``embedding_lookup``, ``apply_gradients(gradients,
preserved_outputs)``) with the checks of that file (a lookup's control-flow check is TF's
own), lays its tables out as on the SparseCores by TF's own code
(:mod:`..sparse_core_layout`), enforces the per-SparseCore id bounds, and applies the
SparseCore kernels' update rules (those of
:class:`~sparse_dp.layers.embedding_backends.doubles.engine_double.EngineDouble`; Adam always
lazy). Its checkpoints restore into ``TPUEmbeddingForServing``. Not modelled, and refused where
a setting asks for it: table stacking, id dropping, pipelining, FTRL, sparse and ragged
inputs, several replicas. Imported on TF 2.16+ only. See docs/tpu.md ("The API doubles").
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
  # enqueue's check: never inside a function nested in strategy.run's TPUReplicateContext.
  _raise_error_for_incorrect_control_flow_context = (
      _V2._raise_error_for_incorrect_control_flow_context)
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
    """``(activations, preserved_outputs)`` of one lookup (changes nothing), refused as
    TF's ``enqueue`` refuses it inside a function nested in a ``TPUReplicateContext``."""
    self._raise_error_for_incorrect_control_flow_context()
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
