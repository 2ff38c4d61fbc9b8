"""Rows of a table gathered inside ``tf.vectorized_map``, one program for all examples.

The DP step runs each example's forward pass alone under ``tf.vectorized_map``
(:mod:`sparse_dp.training.dp_step.per_example`), whose parallel-for converter has no
rule for ``ResourceGather`` (a gather from a variable) and would run it in a
loop over the examples. :func:`gather_from_variable` gives the op that rule:
a gather of a loop-invariant table with per-example ids ``[n, ...]`` is one
gather with the stacked ids, ``[n, ..., d]``. Only the rows asked for are read
(a variable on a parameter server sends those rows, not the table).
A ``ShardedVariable``'s shards hold contiguous row ranges; each shard is
gathered at the ids it holds (clamped elsewhere, then masked), so no
per-example partition of ids (``DynamicPartition``, of varying sizes) is built.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops
from tensorflow.python.ops.parallel_for import pfor


def gather_from_variable(variable, ids: tf.Tensor) -> tf.Tensor:
  """``tf.gather(variable, ids)``, with its parallel-for rule attached."""
  handle = getattr(variable, "handle", None)
  if handle is None or handle.dtype != tf.resource:
    return tf.gather(tf.convert_to_tensor(variable), ids)
  # An AutoCastVariable (mixed precision) stores float32 and may read as 16 bits:
  # its dtype is the read dtype on tf-keras 2.21, the stored one on Keras 2.15.
  rows = gen_resource_variable_ops.resource_gather(
      handle, ids, dtype=getattr(variable, "true_dtype", variable.dtype))
  if not tf.executing_eagerly():
    rows.op.pfor_converter = _stacked_ids_gather
  return tf.cast(rows, variable.dtype)


def gather_from_shards(shards: list, ids: tf.Tensor) -> tf.Tensor:
  """Rows ``ids`` of the table whose consecutive row ranges are ``shards``."""
  ids = tf.cast(ids, tf.int64)
  rows, start = None, 0
  for shard in shards:
    size = int(shard.shape[0])
    local = ids - start
    held = tf.logical_and(local >= 0, local < size)
    part = gather_from_variable(shard, tf.clip_by_value(local, 0, size - 1))
    part = tf.where(tf.reshape(held, tf.concat([tf.shape(held), [1]], 0)), part,
                    tf.zeros_like(part))
    rows = part if rows is None else rows + part
    start += size
  return rows


def _stacked_ids_gather(pfor_input):
  """The parallel-for rule of ``ResourceGather`` with a loop-invariant table."""
  if pfor_input.get_attr("batch_dims") != 0:
    raise pfor.ConversionNotImplementedError("ResourceGather with batch_dims")
  table = pfor_input.unstacked_input(0)
  ids, stacked, _ = pfor_input.input(1)
  rows = gen_resource_variable_ops.resource_gather(table, ids, dtype=pfor_input.get_attr("dtype"))
  return pfor.wrap(rows, stacked)
