"""A few-minute TPU smoke test of the DP step through the TPU embedding path.

Settles what no machine of this project can (docs/tpu.md, "What has run on TPU hardware"):
that the real engine's rounds run, that the step compiles for every core, its first-step and
steady step times, and, run twice (``--cores all`` then ``--cores 1``), that every core's
share sums to the one-core update (the two runs' table checksums agree to float rounding).
Prints a table to paste into an issue and writes it as JSON with ``--out``.

On a TPU VM::

    python benchmarks/tpu_smoke.py --tpu local --cores all --out all.json
    python benchmarks/tpu_smoke.py --tpu local --cores 1 --out one.json

Off TPU (``--tpu none``) the same steps run through ``TPUTrainer`` and the V1 API double, on
CPU: the script's own check. See docs/tpu.md ("Smoke test").
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding, embedding_backends
from sparse_dp.layers.embedding_backends.doubles.tpu_api_double import TPUEmbeddingAPIDouble
from sparse_dp.training.tpu_loop import TPUTrainer

VOCABULARY, WIDTH, EXAMPLES, BATCH = 10_000, 16, 65_536, 1_024
CONFIG = dict(sigma1=3.0, sigma2=0.8, threshold=6.0, noise_seed=7)


def parse(argv=None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--tpu", default="local",
                      help="'local', a TPU name or grpc:// address; 'none': off TPU, doubles")
  parser.add_argument("--cores", choices=("all", "1"), default="all")
  parser.add_argument("--steps", type=int, default=6, help="DP steps (the first compiles)")
  parser.add_argument("--out", help="write the table as JSON here")
  return parser.parse_args(argv)


def tpu_strategy(tpu: str, cores: str) -> tf.distribute.Strategy:
  """A ``TPUStrategy`` of every core of ``tpu``, or of its first core only."""
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
  tf.config.experimental_connect_to_cluster(resolver)
  topology = tf.tpu.experimental.initialize_tpu_system(resolver)
  assignment = (None if cores == "all" else
                tf.tpu.experimental.DeviceAssignment.build(topology, num_replicas=1))
  return tf.distribute.TPUStrategy(resolver, experimental_device_assignment=assignment)


def private_model(strategy: tf.distribute.Strategy, engine: bool):
  """A one-table model made private for DP-AdaFEST, its table on the host if an engine trains
  it; returns ``(model, private)``."""
  with strategy.scope():
    keras.utils.set_random_seed(0)
    ids = keras.Input(shape=(), dtype=tf.int64, name="ids")
    table = Embedding(VOCABULARY, WIDTH, name="ids_table",
                      table_placement="host" if engine else "default_device")
    hidden = keras.layers.Dense(16, activation="relu")(table(ids))
    model = keras.Model(ids, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(0.01),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    embedding = "auto" if embedding_backends.on_tpu(strategy) else "cpu"
    private = sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", **CONFIG),
                                     num_examples=EXAMPLES, batch_size=BATCH,
                                     embedding=embedding)
  return model, private


class StepTimes(keras.callbacks.Callback):
  """Seconds of each ``fit`` step."""

  def __init__(self):
    super().__init__()
    self.seconds = []

  def on_train_batch_begin(self, batch, logs=None):
    self._start = time.perf_counter()

  def on_train_batch_end(self, batch, logs=None):
    self.seconds.append(time.perf_counter() - self._start)


def train(model, private, steps: int, off_tpu: bool) -> tuple[str, float, float]:
  """Trains ``steps`` DP steps on Poisson batches; returns the route, the first step's
  seconds (tracing and compiling included) and the later steps' mean seconds."""
  rng = np.random.default_rng(0)
  ids = (rng.zipf(1.3, EXAMPLES) % VOCABULARY).astype(np.int64)  # a long tail, as real ids
  labels = (rng.random(EXAMPLES) < 0.25).astype(np.float32)
  batches = private.poisson_dataset(ids, labels, padded=True)  # fresh batches on every pass
  if private.embedding_choice.name == "tpu" or off_tpu:
    trainer = TPUTrainer(private, api_factory=TPUEmbeddingAPIDouble if off_tpu else None)
    route = "TPUTrainer (two programs a step)"

    def run(count):
      trainer.fit(batches, steps=count)
  else:
    route = "model.fit"

    def run(count):
      model.fit(batches.take(count), verbose=0)
  start = time.perf_counter()
  run(1)
  first = time.perf_counter() - start
  start = time.perf_counter()
  if steps > 1:
    run(steps - 1)
  return route, first, (time.perf_counter() - start) / max(steps - 1, 1)


def smoke(args: argparse.Namespace) -> dict:
  """Runs the smoke test; returns its table, a dict of what it found."""
  off_tpu = args.tpu == "none"
  strategy = tf.distribute.get_strategy() if off_tpu else tpu_strategy(args.tpu, args.cores)
  feature = embedding_backends.embedding_feature(strategy)
  engine = off_tpu or embedding_backends.choose_backend("auto", strategy).name != "cpu"
  model, private = private_model(strategy, engine)
  initial = model.get_layer("ids_table").embeddings.numpy()
  route, first, steady = train(model, private, args.steps, off_tpu)
  table = model.get_layer("ids_table").embeddings.numpy()
  return {
      "tensorflow": tf.__version__,
      "device": "CPU (off TPU)" if off_tpu else strategy.extended.worker_devices[0],
      "embedding_feature": getattr(feature, "name", None),
      "replicas": strategy.num_replicas_in_sync,
      "backend": private.embedding_backend.name,
      "route": route,
      "steps": int(private.steps_taken.numpy()),
      "first_step_s": round(first, 3),
      "steady_step_ms": round(1e3 * steady, 2) if args.steps > 1 else None,
      "epsilon": private.epsilon(),
      "weights_finite": all(bool(np.isfinite(w.numpy()).all()) for w in model.weights),
      "rows_changed": int(np.count_nonzero(np.any(table != initial, axis=1))),
      # Equal to float rounding between --cores all and --cores 1 (same seeds).
      "table_checksum": float(np.sum(table.astype(np.float64)
                                     * np.arange(1, table.size + 1).reshape(table.shape))),
  }


def main(argv=None) -> int:
  args = parse(argv)
  if args.steps < 1:
    raise SystemExit(f"tpu_smoke: --steps must be at least 1, got {args.steps}")
  result = smoke(args)
  width = max(map(len, result))
  print("| check | value |\n|---|---|")
  for key, value in result.items():
    print(f"| {key:<{width}} | {value} |")
  if args.out:
    with open(args.out, "w") as handle:
      json.dump(result, handle, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
