"""Parameter-server layout of ``sparse-dp train --strategy ps``: table shards follow the cluster."""

import pytest
import tensorflow as tf

from sparse_dp.distribute.local_cluster import table_partitioner


def _cluster(parameter_servers: int):
  """A resolver of a cluster spec (no server is started: the partitioner reads the spec)."""
  spec = {"chief": ["host0:2222"], "worker": ["host1:2222"],
          "ps": [f"ps{i}:2222" for i in range(parameter_servers)]}
  return tf.distribute.cluster_resolver.SimpleClusterResolver(tf.train.ClusterSpec(spec))


@pytest.mark.parametrize("parameter_servers", [1, 2, 3, 5])
def test_a_large_table_gets_one_shard_per_parameter_server(parameter_servers):
  partitioner = table_partitioner(_cluster(parameter_servers), min_shard_bytes=1024)
  table, kernel = tf.TensorShape([100_000, 16]), tf.TensorShape([16, 8])
  assert partitioner(table, tf.float32) == [parameter_servers, 1]
  assert partitioner(kernel, tf.float32) == [1, 1]  # a small Dense kernel stays whole
  # A Dense kernel larger than a shard stays whole too: DP clipping reads it whole
  # (the pCTR tower's 598 x 598 kernel is 1.4 MB).
  assert partitioner(tf.TensorShape([598, 598]), tf.float32) == [1, 1]
  assert partitioner(tf.TensorShape([100_000]), tf.float32) == [1]
  # An explicit count still caps it.
  assert table_partitioner(_cluster(parameter_servers), 1, 1024)(table, tf.float32) == [1, 1]
