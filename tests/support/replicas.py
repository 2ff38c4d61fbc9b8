"""One replica's view of a TPU host's replicas, to compile its program with XLA on one device.

A TPU compiles one program for all replicas. Off TPU XLA cannot run a ``MirroredStrategy`` step
on several devices (it places one program on one device), so the replica program is compiled
alone, under :class:`StaticReplicaContext` in place of ``tf.distribute.get_replica_context()``.
The replica id and every collective's result are values of the running program, as on a TPU:
XLA cannot fold them into the program when it compiles it (``tf.function(jit_compile=True)``
would make a plain input or a variable's value a compile-time constant, and recompile for each),
so a shape that depends on them does not compile. Collectives return a TPU's static shapes;
their values are stand-ins (every replica holds this one's), and TF's TPU implementations of
the collectives (an all-reduce of one-hot parts for int32, ``all_to_all`` for int64) are not
modelled: only the shapes and what XLA can know of the values are. Stricter than a TPU, an
all-gather of int64 (which TF routes through ``all_to_all`` there) is refused: the step
exchanges int32, which a TPU's all-gather takes natively.
"""

from __future__ import annotations

import tensorflow as tf


def _known_when_running(value: tf.Tensor) -> tf.Tensor:
  """``value``, as a value XLA can neither fold into the program nor bound."""
  zero = tf.random.stateless_uniform([], [0, 0]) * 0.0
  return value + tf.cast(zero, value.dtype)


class StaticReplicaContext:
  """``num_replicas_in_sync``, ``replica_id_in_sync_group``, ``all_gather`` and ``all_reduce``
  (``SUM``) of ``replicas`` replicas, seen from replica ``replica_id`` (an int, or a tensor
  input of the program: one compiled program then serves every replica)."""

  def __init__(self, replicas: int, replica_id: int):
    self.num_replicas_in_sync = replicas
    self.replica_id_in_sync_group = _known_when_running(tf.cast(replica_id, tf.int32))

  def _exchanged(self, value: tf.Tensor) -> tf.Tensor:
    """``[replicas, *value.shape]``: every replica's value, as the running program gets it."""
    return _known_when_running(tf.stack([value] * self.num_replicas_in_sync))

  def all_gather(self, value: tf.Tensor, axis: int) -> tf.Tensor:
    """``replicas`` values of ``value``'s shape laid along ``axis`` (a TPU's all-gather)."""
    if value.dtype in (tf.int64, tf.uint64):
      raise TypeError(f"an all-gather of {value.dtype.name}: exchange int32 words")
    return tf.concat(tf.unstack(self._exchanged(value)), axis)

  def all_reduce(self, reduce_op, value: tf.Tensor) -> tf.Tensor:
    if reduce_op != tf.distribute.ReduceOp.SUM:
      raise NotImplementedError(f"StaticReplicaContext reduces by SUM only, got {reduce_op}")
    return tf.reduce_sum(self._exchanged(value), 0)
