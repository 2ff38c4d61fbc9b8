"""DP steps on an in-process parameter-server cluster (2 PS, 2 workers); prints JSON.

Its ``"replicas"`` are ``ps_replicas.py``'s results, run first in this process.

Run as a script: the cluster connects this process's eager context to it, so
``test_parameter_servers.py`` runs it in a fresh process.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf
from ps_replicas import replica_results  # first: it gives this process two logical CPUs

import sparse_dp
from sparse_dp import keras
from sparse_dp.distribute import ParameterServerTraining, local_cluster
from sparse_dp.layers import Embedding
from sparse_dp.mechanisms.noise import dense_noise
from sparse_dp.optimizers import RowwiseAdagrad

VOCAB, BATCH, N = 200, 64, 640
CONFIGS = {
    "dpsgd": {"algorithm": "dpsgd", "noise_multiplier": 1.0},
    "adafest": {"algorithm": "adafest", "sigma1": 1.0, "sigma2": 1.0, "threshold": 1.5},
    "dpsgd-chunks": {"algorithm": "dpsgd", "noise_multiplier": 1.0},
    "adafest-rowwise": {"algorithm": "adafest", "sigma1": 1.0, "sigma2": 1.0, "threshold": 1.5},
}
# The table's noise in chunks of 64 rows (mechanisms.noise.dense_noise): an update over every row.
CHUNK_ROWS = {"dpsgd-chunks": 64}
# DP-AdaFEST's steps through RowwiseAdagrad: one accumulator per row of each shard.
OPTIMIZERS = {"adafest-rowwise": lambda: RowwiseAdagrad(0.5)}
DATA = np.random.default_rng(0)
IDS = (DATA.zipf(1.5, N) % VOCAB).astype("int64")
LABELS = DATA.integers(0, 2, (N, 1)).astype("float32")


def private_model(strategy, config, optimizer=None, initial=None):
  """The model made private, from ``initial`` weights if given (a sharded table's initializer
  draws each shard apart): assigned before make_private, as a user's initial weights."""
  with strategy.scope():
    keras.utils.set_random_seed(5)
    inputs = keras.Input(shape=(), dtype=tf.int64)
    table = Embedding(VOCAB, 4)
    hidden = keras.layers.Dense(8, activation="relu")(table(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=optimizer() if optimizer else keras.optimizers.legacy.SGD(0.5),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    if initial is not None:
      table.embeddings.assign(initial[0])
      for weight, value in zip(model.trainable_weights[-4:], initial[1:]):
        weight.assign(value)
    private = sparse_dp.make_private(model, sparse_dp.DPConfig(noise_seed=1, **config),
                                     num_examples=N, batch_size=BATCH)
  return private, table


def weights(model, table):
  """Every trainable weight, a sharded table as one array."""
  values = [np.concatenate([v.numpy() for v in table.embeddings.variables])
            if hasattr(table.embeddings, "variables") else table.embeddings.numpy()]
  return [v.tolist() for v in values + [w.numpy() for w in model.trainable_weights[-4:]]]


def in_order(strategy, config, initial=None, optimizer=None):
  """Three steps, each one scheduled after the last finished (from ``initial`` weights)."""
  private, table = private_model(strategy, config, optimizer, initial)
  start = weights(private.model, table)
  trainer = ParameterServerTraining(private, IDS, LABELS)
  keys = [key for _ in range(3) for key in trainer.fit(steps=1)["keys"]]
  tables = getattr(table.embeddings, "variables", [table.embeddings])
  accumulators = [private.model.optimizer.get_slot(shard, "accumulator").numpy().tolist()
                  for shard in tables] if optimizer else []
  return {"weights": weights(private.model, table), "keys": keys, "initial": start,
          "accumulators": accumulators,
          "steps": private.accountant.steps,
          "devices": [v.device for v in getattr(table.embeddings, "variables", [])]}


# What the coordinator sees when a worker's connection to a parameter server
# fails: it puts the closure back and re-runs it (cluster_coordinator.py,
# "transient connectivity failure").
PS_LOST = ("unknown device: GRPC error information from remote target "
           "/job:ps/replica:0/task:0 (injected: the worker lost it after the step's update)")


def lost_after_update(strategy, steps=4, lost_key=1):
  """``steps`` steps on both workers; the attempt keyed ``lost_key`` fails after its update."""
  private, _ = private_model(strategy, CONFIGS["dpsgd"])
  trainer = ParameterServerTraining(private, IDS, LABELS)
  step = trainer._step

  @tf.function
  def losing_step():
    logs = step()
    # Read after the whole step (the step updates it last): the update has landed.
    updates = private.model.optimizer.iterations.read_value()
    with tf.control_dependencies([updates]):
      lost = tf.debugging.Assert(tf.not_equal(logs["key"], lost_key), [PS_LOST])
    with tf.control_dependencies([lost]):
      return {name: tf.identity(value) for name, value in logs.items()}

  trainer._step = losing_step
  expected = private.epsilon(steps + 1)  # before any step: every attempt counted
  logs = trainer.fit(steps=steps)
  return {"keys": logs["keys"], "lost_key": lost_key, "taken": logs["steps"],
          "attempts": logs["attempts"], "counted": private.accountant.steps,
          "updates": int(private.model.optimizer.iterations.numpy()),
          "epsilon": logs["epsilon"], "expected_epsilon": expected}


def main():
  # ps_replicas.py's mirrored replicas, before the cluster connects this process to it: one
  # TensorFlow start for both.
  replicas = replica_results()
  strategy = local_cluster.parameter_server_strategy(table_shards=2, min_shard_bytes=1024)
  results = {"replicas": replicas}
  single_draw = dense_noise.CHUNK_ROWS
  for name, config in CONFIGS.items():
    print("training", name, file=sys.stderr, flush=True)
    dense_noise.CHUNK_ROWS = CHUNK_ROWS.get(name, single_draw)
    optimizer = OPTIMIZERS.get(name)
    sharded = in_order(strategy, config, optimizer=optimizer)
    results[name] = {"cluster": sharded,
                     "alone": in_order(tf.distribute.get_strategy(), config, sharded["initial"],
                                       optimizer)}
  dense_noise.CHUNK_ROWS = single_draw
  print("keras fit, async", file=sys.stderr, flush=True)
  private, _ = private_model(strategy, CONFIGS["adafest"])
  try:
    private.model.fit(IDS, LABELS, batch_size=BATCH)
  except ValueError as error:
    results["keras_fit"] = str(error)
  trainer = ParameterServerTraining(private, IDS, LABELS)
  expected = private.epsilon(8)  # before any step: 8 steps at q = BATCH / N
  logs = trainer.fit(steps=8)  # asynchronous, on both workers
  results["async"] = {"keys": logs["keys"], "steps": private.accountant.steps,
                      "epsilon": logs["epsilon"], "expected_epsilon": expected,
                      "taken": logs["steps"]}
  print("a worker lost after its update", file=sys.stderr, flush=True)
  results["lost"] = lost_after_update(strategy)
  print(json.dumps(results), flush=True)
  os._exit(0)  # the in-process servers never shut down by themselves


if __name__ == "__main__":
  sys.exit(main())
