"""A double of ``TPUEmbeddingV2``, the SparseCore (v5p, v6e) mid-level API, off TPU.

``tf.tpu.experimental.embedding.TPUEmbeddingV2`` (TF 2.16+,
``tensorflow/python/tpu/tpu_embedding_v3.py``, read at TF 2.21) refuses to be
created outside a ``TPUStrategy`` (``TPUEmbeddingV2.__init__``: "should be
created under TPUStrategy"). :class:`TPUEmbeddingV2APIDouble` takes its calls
with the rules of that file (function named at each below) and keeps the
tables in :class:`~sparse_dp.layers.embedding_backends.engine_double.EngineDouble`,
whose update rules are the SparseCore kernels' for SGD, Adagrad and Adam
(``tensorflow/core/tpu/kernels/sparse_core_xla_ops.cc``: the optimizer is a
per-row computation applied to the rows of the lookup's CSR; Adam's is
``m <- b1 m + (1 - b1) g``, ``v <- b2 v + (1 - b2) g^2``,
``w <- w - lr m / (sqrt(v + e1) + e2)`` with ``(e1, e2) = (eps^2, 0)`` under
``use_sum_inside_sqrt``, else ``(0, eps)``, no bias correction; lazy whatever
``lazy_adam`` says, which ``apply_gradients`` does not pass: the double takes
``lazy_adam=True``, the rule that runs). Modelled:

* ``__init__``: weight decay refused (``NotImplementedError``, as ``__init__``);
  ``SparseCoreEmbeddingConfig()`` when none is given; ``max_ids_per_table`` and
  ``max_unique_ids_per_table`` per table, 256 for a table they do not name
  (``DEFAULT_MAX_IDS_PER_TABLE``,
  ``_update_sparse_core_buffer_size_after_table_stacking``); every feature with
  an ``output_shape`` (its static sample count:
  ``_stack_tables_with_same_table_dim_and_optimizer``), a multiple of the
  SparseCores per chip (``_unstack_activations`` and ``_stack_gradients`` cut
  each feature into one slice per SparseCore; the lookup kernel refuses
  "input_size ... not divisible by the number of sparsecores per chip");
* ``embedding_lookup(features)`` is ``enqueue`` then ``dequeue``
  (``embedding_lookup``), building on first use (``_maybe_build``): features
  of ``feature_config``'s structure (``enqueue``: ``nest.assert_same_structure``),
  each a dense tensor of its ``output_shape``'s sample count
  (``_convert_input_feature_to_list_of_coo_tensors``); it returns the
  activations (``output_shape + [dim]`` per feature) and the
  ``preserved_outputs`` (by table name: what ``apply_gradients`` updates);
* the SparseCore bounds: rows are sharded ``mod`` the ``replicas x SparseCores
  per chip`` SparseCores (``_xla_sharding_strategy: mod``); one lookup may send
  a table's SparseCore at most ``max_ids_per_table`` ids and
  ``max_unique_ids_per_table`` distinct ids. Past them, with
  ``allow_id_dropping=False``, the double fails the lookup (the message is the
  double's);
* ``apply_gradients(gradients, preserved_outputs)``: refused before ``build``
  (its ``RuntimeError``); gradients of the structure, ``None`` a zero gradient,
  a non-tensor refused, each of its feature's ``output_shape + [dim]`` size
  (``_stack_gradients`` reshapes it to ``[-1, dim]`` and slices it); each
  table's optimizer applied to the rows of the lookup whose
  ``preserved_outputs`` are given, gradients summed per row.
* no queue and no training flag: lookups and updates may be placed anywhere in
  a program, several of each ("lookup can be placed anywhere, multiple
  instances allowed" on V2 hardware); an update names its lookup by its
  ``preserved_outputs``.

Inside a program XLA compiles the bound checks compile away (as the V1 double's:
:func:`~sparse_dp.layers.embedding_backends.api_double._require`).

Not modelled (refused where a setting asks for it): table stacking
(``disable_table_stacking=True`` required), id dropping, pipelining
(``pipeline_execution_with_tensor_core``), FTRL and Adagrad with momentum,
sparse and ragged inputs, weights, quantization, the vocabulary and width
padding of the SparseCore layout, several replicas, and the checks that need
a TPU replicate context (``_raise_error_for_incorrect_control_flow_context``:
no XLA control flow between ``strategy.run`` and a lookup).
"""

from __future__ import annotations

import functools
import operator

import tensorflow as tf
from tensorflow.python.util import nest  # the real API's nest (flatten_with_joined_string_paths)

from sparse_dp.layers.embedding_backends.api_double import _require
from sparse_dp.layers.embedding_backends.engine_double import EngineDouble
from sparse_dp.layers.embedding_backends.hardware import sparse_cores_per_chip
from sparse_dp.mechanisms import padding

_API = tf.tpu.experimental.embedding


def sample_count(feature) -> int:
  """The static number of ids a feature takes per lookup (its ``output_shape``'s size)."""
  return functools.reduce(operator.mul, feature.output_shape, 1)


class TPUEmbeddingV2APIDouble:
  """``embedding_lookup``/``apply_gradients``/``build`` of ``TPUEmbeddingV2``, off TPU.

  ``feature_config``: a flat ``{name: FeatureConfig}`` dict of dense univalent
  features, each with its ``output_shape``.
  """

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
    self._feature_config = feature_config
    self._flat_features = nest.flatten_with_joined_string_paths(feature_config)
    tables = {id(f.table): f.table for _, f in self._flat_features}.values()
    for table in tables:
      table_optimizer = table.optimizer or optimizer
      if table_optimizer is not None and (
          table_optimizer.weight_decay_factor is not None
          or table_optimizer.multiply_weight_decay_factor_by_learning_rate is not None):
        raise NotImplementedError(
            "weight_decay_factor and multiply_weight_decay_factor_by_learning_rate are not "
            f"supported yet. But found in table {table.name} setting.")
    per_chip = sparse_cores_per_chip(tf.distribute.get_strategy())
    self._sparse_cores = tf.distribute.get_strategy().num_replicas_in_sync * per_chip
    for path, feature in self._flat_features:
      if not feature.output_shape:
        raise ValueError(f"TPUEmbeddingV2: feature {path} has no output_shape; the API sizes "
                         "its buffers from every feature's static shape when it is created")
      if sample_count(feature) % per_chip:
        raise ValueError(f"TPUEmbeddingV2: feature {path} takes {sample_count(feature)} ids, "
                         f"not divisible by the number of sparsecores per chip {per_chip}")
    real = _API.TPUEmbeddingV2
    self._max_ids = {t.name: (config.max_ids_per_table or {}).get(
        t.name, real.DEFAULT_MAX_IDS_PER_TABLE) for t in tables}
    self._max_unique_ids = {t.name: (config.max_unique_ids_per_table or {}).get(
        t.name, real.DEFAULT_MAX_UNIQUE_IDS_PER_TABLE) for t in tables}
    self._storage = EngineDouble(feature_config, optimizer)
    self._built = False

  @property
  def _variables(self) -> dict:
    return {name: self._storage.slots(name) for name in self._max_ids}

  @property
  def checkpointable(self) -> EngineDouble:
    """The tables and slots, saved under the keys ``TPUEmbeddingForServing`` saves them under."""
    return self._storage

  def build(self) -> None:
    if not self._built:
      self._storage.build()
      self._built = True

  def embedding_lookup(self, features, weights=None) -> tuple:
    """``(activations, preserved_outputs)`` of one lookup (changes nothing)."""
    if weights is not None:
      raise ValueError("TPUEmbeddingV2 double: weights are not modelled")
    with tf.init_scope():
      self.build()
    nest.assert_same_structure(self._feature_config, features)
    ids = {}
    for (path, feature), given in zip(self._flat_features, nest.flatten(features)):
      if not isinstance(given, tf.Tensor):
        raise ValueError(f"Input {path} is of type {type(given)}: the double models dense "
                         "tf.Tensor ids only")
      if given.shape.num_elements() != sample_count(feature):
        raise ValueError(f"feature {path} takes {sample_count(feature)} ids (output_shape "
                         f"{list(feature.output_shape)}), got a tensor of shape {given.shape}")
      ids[path] = tf.reshape(tf.cast(given, tf.int32), [-1])
    preserved = {}
    for table in self._max_ids:
      names = [p for p, f in self._flat_features if f.table.name == table]
      with tf.control_dependencies(self._fits_sparse_cores(table, [ids[n] for n in names])):
        preserved[table] = {n: tf.identity(ids[n]) for n in names}
    rows = self._storage.lookup({n: i for by_name in preserved.values()
                                 for n, i in by_name.items()})
    activations = [tf.reshape(rows[path], list(f.output_shape) + [f.table.dim])
                   for path, f in self._flat_features]
    return nest.pack_sequence_as(self._feature_config, activations), preserved

  def __call__(self, features, weights=None) -> tuple:
    return self.embedding_lookup(features, weights)

  def apply_gradients(self, gradients, preserved_outputs: dict) -> None:
    """Each table's optimizer on the rows of the lookup ``preserved_outputs`` came from."""
    if not self._built:
      raise RuntimeError("apply_gradients called on unbuilt TPUEmbeddingV2 object. Please "
                         "either call the embedding lookup method first or manually call the "
                         "build method.")
    nest.assert_same_structure(self._feature_config, gradients)
    flat = {}
    for (path, feature), gradient in zip(self._flat_features, nest.flatten(gradients)):
      full = list(feature.output_shape) + [feature.table.dim]
      if gradient is None:
        gradient = tf.zeros(full)
      elif not isinstance(gradient, tf.Tensor):
        raise ValueError(f"found non-tensor type: {type(gradient)} at path {path}.")
      elif gradient.shape.num_elements() != sample_count(feature) * feature.table.dim:
        raise ValueError(f"Found gradient of shape {gradient.shape} at path {path}; "
                         f"expected {full}.")
      flat[path] = gradient
    missing = sorted(set(self._max_ids) - set(preserved_outputs))
    if missing:
      raise ValueError(f"preserved_outputs holds no lookup of tables {missing}: pass the "
                       "second output of the embedding_lookup whose rows to update")
    ids = {n: i for table in self._max_ids for n, i in preserved_outputs[table].items()}
    self._storage.apply_gradients(ids, flat)

  def _fits_sparse_cores(self, table: str, ids: list) -> list:
    """Checks that no SparseCore gets more ids, or distinct ids, of ``table`` than its bounds."""
    ids = tf.cast(tf.concat(ids, 0), tf.int64)

    def most_on_one_core(rows):  # PAD (the padding of a unique) counts on none
      core = tf.where(padding.is_valid(rows), rows % self._sparse_cores, -1)
      return tf.reduce_max(tf.reduce_sum(tf.one_hot(core, self._sparse_cores, dtype=tf.int32), 0))

    most, most_unique = most_on_one_core(ids), most_on_one_core(padding.padded_unique(ids).values)
    limit = (f"with allow_id_dropping=False a lookup fails past them (rows are sharded mod "
             f"{self._sparse_cores} SparseCores)")
    return (_require(most <= self._max_ids[table],
                     f"a lookup sent more than max_ids_per_table[{table!r}] = "
                     f"{self._max_ids[table]} ids of table {table} to one SparseCore; {limit}")
            + _require(most_unique <= self._max_unique_ids[table],
                       f"a lookup sent more than max_unique_ids_per_table[{table!r}] = "
                       f"{self._max_unique_ids[table]} distinct ids of table {table} to one "
                       f"SparseCore; {limit}"))
