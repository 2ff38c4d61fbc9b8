"""The DP update of a table on SparseCore (v5p, v6e), through ``TPUEmbeddingV2``, in one program.

``TPUEmbeddingV2`` has no training flag and no queue: ``apply_gradients(gradients,
preserved_outputs)`` updates the rows of one ``embedding_lookup``, and lookups may be placed
anywhere in a program. :class:`SparseCoreBackend` therefore applies the update of
:class:`~.tpu.TPUEmbeddingBackend` (table of ``V + 1`` rows, dummy row ``V``, features
``<layer>`` and ``<layer>/dp_update``) inside the step Keras ``fit`` runs: one lookup of the
batch's ids, the mechanisms as on CPU, a lookup of the selected rows padded to ``M``, then
``apply_gradients`` of the noisy rows with that lookup's ``preserved_outputs``. It computes no
DP quantity; :func:`dp_sparse_core_config` keeps id dropping off and sizes the SparseCore
bounds so that no lookup exceeds them. The layer's Keras table is synced from the engine
(:meth:`~.tpu.TPUEmbeddingBackend.sync_tables`) when ``fit`` ends, before validation and at each
epoch's end. Never run on a TPU: tested through
:class:`~.doubles.sparsecore_api_double.TPUEmbeddingV2APIDouble`. See docs/tpu.md ("SparseCore").
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable, Optional

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.layers.embedding_backends import sparse_core_layout
from sparse_dp.layers.embedding_backends.hardware import sparse_cores_per_chip
from sparse_dp.layers.embedding_backends.live_engine import StaticFeatureEngine
from sparse_dp.layers.embedding_backends.tpu import (
  TPUEmbeddingBackend,
  _initial_rows,
  example_round,
  feature_bounds,
)

_API = tf.tpu.experimental.embedding


def dp_sparse_core_config(table_ids: dict, table_rows: dict, given=None):
  """The ``SparseCoreEmbeddingConfig`` of a DP step; refuses a setting that breaks it.

  ``table_ids[table]``: the ids one lookup sends the table; ``table_rows[table]``:
  its rows. ``given``: the user's config (its other settings kept).
  """
  given = given or _API.SparseCoreEmbeddingConfig()
  if given.allow_id_dropping:
    raise ValueError(
        "SparseCoreEmbeddingConfig(allow_id_dropping=True): a dropped id loses its row's DP "
        "update depending on how many ids other examples sent to the same SparseCore, which "
        "the clipping bound does not cover; pass allow_id_dropping=False (the default)")
  needed = {"max_ids_per_table": dict(table_ids),
            "max_unique_ids_per_table": {t: min(n, table_rows[t]) for t, n in table_ids.items()}}
  settings = {}
  for setting, least in needed.items():
    chosen = dict(getattr(given, setting) or {})
    for table, count in least.items():
      if chosen.get(table, count) < count:
        raise ValueError(
            f"SparseCoreEmbeddingConfig({setting}={{{table!r}: {chosen[table]}}}) is below the "
            f"{count} ids one DP step's lookup may send one SparseCore (its update bound and "
            f"padding; rows are sharded mod the SparseCores): raise it to at least {count}, or "
            "leave the table out and the backend sets it")
      chosen[table] = max(chosen.get(table, count), count)
    settings[setting] = chosen
  return dataclasses.replace(given, disable_table_stacking=True, **settings)


class SparseCoreEngine(StaticFeatureEngine):
  """Lookups and updates of a ``TPUEmbeddingV2`` object, with :class:`.EngineDouble`'s interface.

  ``input_bounds[name]``: the most ids feature ``name`` takes per lookup,
  padded here to a multiple of the SparseCores per chip.
  ``sparse_core_config``: the user's ``SparseCoreEmbeddingConfig``, completed
  by :func:`dp_sparse_core_config`. ``api_factory``:
  default the real ``TPUEmbeddingV2`` (create under the ``TPUStrategy``'s
  scope); tests pass :class:`~.doubles.sparsecore_api_double.TPUEmbeddingV2APIDouble`.
  """

  def __init__(self, feature_config: dict, optimizer, input_bounds: dict,
               sparse_core_config=None, api_factory: Optional[Callable] = None):
    per_chip = sparse_cores_per_chip(tf.distribute.get_strategy())
    bounds = {name: -(-int(bound) // per_chip) * per_chip for name, bound in input_bounds.items()}
    shaped = {name: _API.FeatureConfig(table=f.table, output_shape=[bounds[name]], name=f.name)
              for name, f in feature_config.items()}
    tables = {f.table.name: f.table for f in shaped.values()}
    config = dp_sparse_core_config(
        {t: sum(bounds[n] for n, f in shaped.items() if f.table.name == t) for t in tables},
        {t: table.vocabulary_size for t, table in tables.items()}, sparse_core_config)
    make = api_factory or _API.TPUEmbeddingV2
    super().__init__(shaped, optimizer, bounds, functools.partial(
        make, pipeline_execution_with_tensor_core=False, sparse_core_embedding_config=config))

  @property
  def backend_name(self) -> str:
    """``"tpu"`` on the real API object; its double names itself
    (``"tpu-sparsecore-api-double"``)."""
    return getattr(self.api, "backend_name", "tpu")

  def build(self) -> None:
    self.api.build()

  def slots(self, table_name: str) -> dict:
    """``{"parameters": rows, slot: rows}`` of one table, in its own row order: read on the
    host from the SparseCore layout (:func:`.sparse_core_layout.host_rows`)."""
    layout = self.api.embedding_layouts[table_name]
    return {slot: sparse_core_layout.host_rows(variable, layout)
            for slot, variable in self.api.variables[layout.stacked_table_name].items()}

  def lookup(self, features: dict) -> dict:
    """The rows of each named feature's ids (the others the dummy row; changes nothing)."""
    activations, _ = self.api.embedding_lookup(self._padded_ids(features))
    return {name: activations[name][:tf.size(ids)] + self._anchor
            for name, ids in features.items()}

  def apply_gradients(self, features: dict, gradients: dict) -> tf.Operation:
    """A lookup of ``features`` and the update of its rows by their activation ``gradients``."""
    _, preserved = self.api.embedding_lookup(self._padded_ids(features))
    self.api.apply_gradients(self._padded_gradients(gradients), preserved)
    return tf.no_op()


class SparseCoreBackend(TPUEmbeddingBackend):
  """The tables in a ``TPUEmbeddingV2`` engine, updated inside the DP step ``fit`` runs.

  This is the backend of SparseCore (V2) hardware: v5p, v6e.
  ``TPUEmbeddingV2`` updates the rows of one ``embedding_lookup``, wherever it is placed in a
  program, so the whole DP step is one program.
  The step makes one lookup of the batch's ids and runs the mechanisms as on CPU.
  It then looks up the selected rows padded to ``M``, and applies the noisy rows with that
  lookup's ``preserved_outputs``.
  The tables and features are :class:`~.tpu.TPUEmbeddingBackend`'s.
  The backend computes no DP quantity.
  Create it under the strategy's scope.

  Args:
    tables: the model's :class:`~sparse_dp.layers.Embedding` layers.
    optimizer: the model's sparse Keras optimizer (see :class:`~.tpu.TPUEmbeddingBackend`).
    update_bounds: ``update_bounds[layer]``, the static length ``M`` of the layer's update
      feature (``sparse_dp.training.wrappers.entry_point.update_bounds``). It is the most rows
      one step selects but with probability ``<= 2e-9``; a step past it fails, as on V1.
    input_bounds: ``input_bounds[layer]``, the most ids the layer looks up per step (its
      model feature's static length).
    input_ids: ``input_ids(x)`` gives each table's ids in a batch's features, by layer name:
      int64 ``[B, k]``, row ``i`` example ``i``'s alone: a
      :func:`sparse_dp.training.dp_step.input_ids.per_example_input_ids`.
    sum_inside_sqrt: as :class:`~.tpu.TPUEmbeddingBackend`'s.
    sparse_core_config (tf.tpu.experimental.embedding.SparseCoreEmbeddingConfig | None): a
      config whose other settings to keep; :func:`dp_sparse_core_config` gives the rules.
    api_factory: see :class:`SparseCoreEngine`.

  Raises:
    ValueError: ``input_ids`` not made by ``per_example_input_ids``; a ``sparse_core_config``
      that allows id dropping, or whose bounds are below what one step's lookup may send a
      SparseCore; or a refusal of
      :class:`~.tpu.TPUEmbeddingBackend`.
  """

  reads_engine_in_step = True  # the lookup training_step makes

  def __init__(self, tables: list, optimizer: keras.optimizers.Optimizer,
               update_bounds: dict, input_bounds: dict, input_ids: Callable[[object], dict],
               sum_inside_sqrt: bool = False, sparse_core_config=None,
               api_factory: Optional[Callable] = None):
    if not getattr(input_ids, "per_example", False):
      raise ValueError("SparseCoreBackend: pass input_ids=per_example_input_ids(input_ids, "
                       "tables) (sparse_dp.training.dp_step.input_ids), whose row i is example "
                       "i's ids alone")
    self.input_ids = input_ids
    super().__init__(tables, optimizer, update_bounds, sum_inside_sqrt, engine_factory=(
        functools.partial(SparseCoreEngine, input_bounds=feature_bounds(input_bounds,
                                                                        update_bounds),
                          sparse_core_config=sparse_core_config, api_factory=api_factory)))

  def _table_initializer(self, layer) -> Callable:
    """The layer's rows and the dummy row, laid out on the strategy's SparseCores
    (:func:`.sparse_core_layout.initializer`)."""
    strategy = tf.distribute.get_strategy()
    rows = functools.partial(_initial_rows(layer), (layer.vocabulary_size + 1, layer.output_dim))
    return sparse_core_layout.initializer(
        lambda dtype: rows(dtype=dtype),
        strategy.num_replicas_in_sync * sparse_cores_per_chip(strategy), layer.name)

  @contextlib.contextmanager
  def training_step(self, features):
    """Step 1: one engine lookup of the ids each table looks up in the batch's ``features``.

    Args:
      features: the batch's model inputs.
    """
    ids = self.input_ids(features)
    activations = self.engine.lookup({name: tf.reshape(value, [-1]) for name, value in ids.items()})
    self._tracing.round = {name: example_round(ids[name], activations[name]) for name in ids}
    try:
      with super().training_step(features):
        yield
    finally:
      self._tracing.round = None

  def apply_table_updates(self, optimizer, updates):
    """Steps 3 and 4: the engine's update of the selected rows; no Keras table is written.

    Args:
      optimizer: the model's Keras optimizer (unused: the engine has its own).
      updates: ``{layer: update}``, each table's update from the DP step.

    Returns:
      A one-element list: the engine's ``apply_gradients`` op of the training round.
    """
    del optimizer
    return [self.engine.apply_gradients(*self.training_round(updates))]
