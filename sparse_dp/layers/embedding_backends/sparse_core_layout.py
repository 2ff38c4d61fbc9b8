"""Where ``TPUEmbeddingV2`` (SparseCore) keeps a table's rows, and the conversions to and from it.

A table's ``SparseCoreTableLayout`` (read from TF 2.21's ``tpu_embedding_v3.py`` and its
helpers) pads it to ``unsharded_padded_shape`` and shards its rows ``mod N`` over the
``N = num_sparse_cores`` SparseCores: row ``i`` is row ``offset + i div N`` of SparseCore
``(i mod N + rotation) mod N``'s shard. :func:`initializer` gives each device's rows of a
table in that sharded order (from ``shard_info``), and :func:`host_rows` reads the table back
as a checkpoint restored into ``TPUEmbeddingForServing`` does, both built on TF's own helpers
(tested against TF's ``_shard_from_cpu_to_sc`` and a restore into ``TPUEmbeddingForServing`` in
``tests/unit/layers/test_tpu_sparsecore_backend.py``). TF 2.15 has no SparseCore API: the
functions are not called there. See docs/tpu.md ("SparseCore").
"""

from __future__ import annotations

from typing import Callable

import tensorflow as tf

try:  # TF 2.16+
  from tensorflow.python.tpu import tpu_embedding_v3_utils as _utils
except ImportError:  # TF 2.15: no TPUEmbeddingV2 (hardware.choose_backend refuses V2 there)
  _utils = None


def initializer(rows: Callable[[tf.DType], tf.Tensor], num_sparse_cores: int, name: str):
  """A ``shard_info``-aware initializer of a table whose logical rows are ``rows(dtype)``.

  Called as ``TPUEmbeddingV2`` calls it: with the padded ``shape`` and a
  device's ``shard_info``, it returns that device's rows in the sharded order:
  the table padded with zeros, laid out by TF's ``shard_table`` (row ``i`` at
  ``(i mod N) x rows / N + i div N``), cut at the ``shard_info`` offset, which
  ``_get_shard_info_for_table`` has already moved back by the rotation (TF's
  stacker rotates a stack's ``k``-th table by ``k x`` SparseCores per chip,
  whole devices: the cut never wraps). That is TF's own
  ``tpu_embedding_v3_utils.shard_initializer``, which needs a ``TPUStrategy``
  (it reads its TPU devices). ``name`` names the table in errors.
  """

  def initialize(shape, dtype, shard_info):
    values = rows(dtype)
    if values.shape[0] > shape[0] or values.shape[1] > shape[1] or shape[0] % num_sparse_cores:
      raise ValueError(f"the SparseCore table {name} ({values.shape[0]} x {values.shape[1]}) "
                       f"does not fit the padded shape {list(shape)} TPUEmbeddingV2 asked "
                       f"for, in rows a multiple of its {num_sparse_cores} SparseCores")
    padded = tf.pad(values, [[0, shape[0] - values.shape[0]], [0, shape[1] - values.shape[1]]])
    start = shard_info.offset[0]
    return _utils.shard_table(num_sparse_cores, padded)[start:start + shard_info.shape[0]]

  return initialize


def stacked_value(variable) -> tf.Tensor:
  """The whole value of a table's variable: on a TPU its per-device shards, in device order."""
  shards = getattr(variable, "values", None)  # TPUEmbeddingShardedVariable
  if shards is None:
    return tf.convert_to_tensor(variable)
  return tf.concat([shard.read_value() for shard in shards], 0)


def host_rows(variable, layout) -> tf.Tensor:
  """The logical rows (``unsharded_shape``) of ``layout``'s table, read from its ``variable``.

  ``variable``: the table's (stacked) variable or one of its slots.
  """
  sharded = _utils.unshuffle_from_sc_to_cpu(
      stacked_value(variable), num_sparse_cores=layout.num_sparse_cores,
      offset_in_shard=layout.sparse_core_shard_row_offset,
      size_in_shard=layout.unsharded_padded_shape[0] // layout.num_sparse_cores,
      shard_rotation=layout.sparse_core_shard_rotation)
  return _utils.remove_padding_from_sc(sharded, tuple(layout.unsharded_shape))


def variable_rows(layout, ids: tf.Tensor) -> tf.Tensor:
  """The rows of the table's variable that hold its logical rows ``ids`` (int32)."""
  shard, position = _utils.map_indices_in_shard(
      layout.num_sparse_cores, layout.sparse_core_shard_row_offset,
      layout.sparse_core_shard_rotation, ids)
  return shard * layout.total_rows_per_sparse_core_shard + position
