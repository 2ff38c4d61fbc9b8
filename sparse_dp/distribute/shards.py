"""Embedding tables sharded across parameter servers: one table's update, split by shard.

Under ``tf.distribute.ParameterServerStrategy`` with a ``variable_partitioner``
a table ``[V, d]`` becomes a ``ShardedVariable``: shard ``s`` holds the rows
``[o_s, o_s + V_s)`` (contiguous along axis 0, ``o_s = V_0 + ... + V_{s-1}``),
each on a parameter server, and ``model.trainable_variables`` lists the
shards. The DP step computes the table's noisy update as one gradient over
global row ids (the DP-AdaFEST selected rows, or all ``V`` rows for DP-SGD):
:func:`split_by_shard` hands each shard the rows it holds, renumbered from 0,
so each parameter server receives only its rows of the update.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.distribute.sharded_variable import ShardedVariable


def is_sharded(variable) -> bool:
  return isinstance(variable, ShardedVariable)


def gradient_key(variable):
  """The key of ``variable``'s gradient: its ``ref()``; a ``ShardedVariable`` (no ``ref``) itself.

  A ``ShardedVariable`` hashes by identity, as a ``ref`` does.
  """
  return variable if is_sharded(variable) else variable.ref()


def split_by_shard(gradients: dict) -> dict:
  """``gradients`` (by :func:`gradient_key`) with each sharded table's split into its shards'."""
  split = {}
  for key, gradient in gradients.items():
    if not is_sharded(key):
      split[key] = gradient
      continue
    start = 0
    for shard in key.variables:
      rows = shard.shape[0]
      split[shard.ref()] = _rows_of(gradient, start, rows, shard.shape)
      start += rows
  return split


def _rows_of(gradient, start: int, rows: int, shape: tf.TensorShape):
  """Rows ``[start, start + rows)`` of a dense or row-sparse gradient, numbered from 0."""
  if not isinstance(gradient, tf.IndexedSlices):
    return gradient[start:start + rows]
  indices = tf.cast(gradient.indices, tf.int64)
  mine = tf.logical_and(indices >= start, indices < start + rows)
  return tf.IndexedSlices(tf.boolean_mask(gradient.values, mine),
                          tf.boolean_mask(indices, mine) - start,
                          tf.constant(shape.as_list(), tf.int64))
