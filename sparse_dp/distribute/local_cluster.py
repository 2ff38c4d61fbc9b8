"""An in-process parameter-server cluster on 127.0.0.1 (tests, ``sparse-dp train --strategy ps``).

Every task is a ``tf.distribute.Server`` on a free localhost port; this
process is the coordinator. A real cluster is described by ``TF_CONFIG`` on
every task instead (docs/clusters.md). Also the strategy
of each ``--strategy`` (:func:`strategy_named`), a TPU's included.
"""

from __future__ import annotations

import functools
import os
import socket
from typing import Optional

import tensorflow as tf

_SERVERS: list = []  # kept alive as long as the process


def _free_ports(count: int) -> list[int]:
  sockets = [socket.socket() for _ in range(count)]
  try:
    for s in sockets:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def start_local_cluster(workers: int = 2, parameter_servers: int = 2
                        ) -> tf.distribute.cluster_resolver.ClusterResolver:
  """Starts ``workers`` worker and ``parameter_servers`` PS tasks here; returns their resolver."""
  if workers < 1 or parameter_servers < 1:
    raise ValueError(f"a parameter-server cluster needs >= 1 worker and >= 1 parameter server, "
                     f"got {workers} and {parameter_servers}")
  ports = iter(_free_ports(workers + parameter_servers))
  spec = {"worker": [f"127.0.0.1:{next(ports)}" for _ in range(workers)],
          "ps": [f"127.0.0.1:{next(ports)}" for _ in range(parameter_servers)]}
  cluster = tf.train.ClusterSpec(spec)
  # Tasks in one process share its threads: a worker's step waits on the
  # parameter servers' reads, and with too few inter-op threads concurrent
  # steps wait on each other for ever (as TensorFlow's own in-process clusters).
  config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=workers + 1)
  for job, tasks in spec.items():
    for index in range(len(tasks)):
      _SERVERS.append(tf.distribute.Server(cluster, job_name=job, task_index=index,
                                           protocol="grpc", config=config, start=True))
  return tf.distribute.cluster_resolver.SimpleClusterResolver(cluster, rpc_layer="grpc")


def parameter_server_strategy(table_shards: Optional[int] = None, min_shard_bytes: int = 1 << 16,
                              workers: int = 2, parameter_servers: int = 2
                              ) -> tf.distribute.experimental.ParameterServerStrategy:
  """A ``ParameterServerStrategy`` whose embedding tables of ``>= min_shard_bytes`` are sharded.

  With ``TF_CONFIG`` set, on the cluster it names (this process must be its
  ``chief``); else on :func:`start_local_cluster`. Variables are split into at
  most ``table_shards`` shards (default: one per parameter server of the
  cluster) of at least ``min_shard_bytes`` each: the embedding tables, never a
  Dense kernel (:class:`TablePartitioner`).
  """
  if os.environ.get("TF_CONFIG"):
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  else:
    resolver = start_local_cluster(workers, parameter_servers)
  return tf.distribute.experimental.ParameterServerStrategy(
      resolver, variable_partitioner=table_partitioner(resolver, table_shards, min_shard_bytes))


# A variable with at least this many rows per column is shaped like an embedding
# table (vocabulary x dimension); a Dense kernel (inputs x units) is not.
TABLE_ROWS_PER_COLUMN = 8


class TablePartitioner(tf.distribute.experimental.partitioners.MinSizePartitioner):
  """``MinSizePartitioner`` over embedding-shaped variables only: a 2-D variable of at
  least ``TABLE_ROWS_PER_COLUMN`` rows per column is split into shards of at least
  ``min_shard_bytes``, every other variable (Dense kernels and biases, which DP
  clipping reads whole) stays in one piece, whatever its size."""

  def __call__(self, shape, dtype, axis=0):
    shape = tf.TensorShape(shape)
    if shape.rank == 2 and shape[0] >= TABLE_ROWS_PER_COLUMN * shape[1]:
      return super().__call__(shape, dtype, axis)
    return [1] * shape.rank


def table_partitioner(resolver: tf.distribute.cluster_resolver.ClusterResolver,
                      table_shards: Optional[int] = None, min_shard_bytes: int = 1 << 16
                      ) -> tf.distribute.experimental.partitioners.Partitioner:
  """Embedding tables in shards of at least ``min_shard_bytes``, at most
  ``table_shards`` (default: the cluster's parameter servers, so that every server
  holds a part of each large table); other variables whole (:class:`TablePartitioner`)."""
  if table_shards is None:
    table_shards = max(1, len(resolver.cluster_spec().as_dict().get("ps", [])))
  return TablePartitioner(min_shard_bytes=min_shard_bytes, max_shards=table_shards)


@functools.lru_cache(maxsize=None)
def tpu_strategy(tpu: str = "local") -> tf.distribute.TPUStrategy:
  """A ``TPUStrategy`` over the cores of TPU ``tpu``; refuses in one line when none is found.

  ``tpu``: ``"local"`` (this TPU VM's TPU), a TPU name or a ``grpc://``
  address (``TPUClusterResolver``). The TPU system is initialised once per
  process: the strategy is kept for every later call.
  """
  try:
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    if tpu != "local":
      tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
  except (ValueError, RuntimeError, OSError, tf.errors.OpError) as error:
    found = (str(error).strip() or type(error).__name__).splitlines()[0].split(". ")[0]
    raise ValueError(f"--strategy tpu: no TPU found (--tpu {tpu!r}: {found}); run on a TPU VM "
                     "(--tpu local) or name a TPU with --tpu NAME, or train with --strategy "
                     "default (CPU or GPU)") from error
  return tf.distribute.TPUStrategy(resolver)


@functools.lru_cache(maxsize=None)
def multi_worker_strategy() -> tf.distribute.MultiWorkerMirroredStrategy:
  """The ``MultiWorkerMirroredStrategy`` of ``TF_CONFIG``'s workers, made once per process.

  It configures the collective ops, which TensorFlow allows only before the
  process's first op: a job makes it before it reads any data (a sample's
  cursor is a variable), and every later call gets the same strategy.
  """
  return tf.distribute.MultiWorkerMirroredStrategy()


STRATEGIES = ("default", "mirrored", "multi-worker", "ps", "tpu")


def strategy_named(name: str, tpu: str = "local") -> tf.distribute.Strategy:
  """The ``--strategy`` of ``sparse-dp train``.

  ``default``: this process's devices as TensorFlow places ops; ``mirrored``:
  ``MirroredStrategy`` over this machine's devices; ``multi-worker``:
  ``MultiWorkerMirroredStrategy`` on the workers ``TF_CONFIG`` names (one
  worker, this process, without it); ``ps``: :func:`parameter_server_strategy`
  (on ``TF_CONFIG``'s cluster, else a localhost one of 2 PS and 2 workers);
  ``tpu``: :func:`tpu_strategy` of ``--tpu``.
  """
  if name == "default":
    return tf.distribute.get_strategy()
  if name == "mirrored":
    return tf.distribute.MirroredStrategy()
  if name == "multi-worker":
    return multi_worker_strategy()
  if name == "ps":
    return parameter_server_strategy()
  if name == "tpu":
    return tpu_strategy(tpu)
  raise ValueError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {name!r}")
