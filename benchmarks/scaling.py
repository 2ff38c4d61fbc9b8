"""Examples per second of DP-AdaFEST and DP-SGD on 1 and 2 MultiWorkerMirroredStrategy workers.

Usage: ``python benchmarks/scaling.py --out benchmarks/results/scaling.json``.
Each worker count runs as fresh localhost worker processes (``TF_CONFIG`` on
127.0.0.1): a small pCTR-like model (26 tables of 20,000 rows x 16, two ReLU
layers of 64) trains ``--steps`` Poisson batches of expected size
``--batch-size`` (global), after ``--warmup`` steps that are not timed.
Worker 0 reports the timed steps' examples per second.
"""

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time

TABLES, VOCAB, DIM, N = 26, 20_000, 16, 200_000


def worker(args):
  import numpy as np
  import tensorflow as tf

  import sparse_dp
  from sparse_dp import keras
  from sparse_dp.layers import Embedding
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  rng = np.random.default_rng(0)
  ids = (rng.zipf(1.3, (N, TABLES)) % VOCAB).astype("int64")
  labels = rng.integers(0, 2, (N, 1)).astype("float32")
  config = ({"algorithm": "adafest", "sigma1": 2.0, "sigma2": 1.0, "threshold": 8.0}
            if args.algorithm == "adafest" else {"algorithm": "dpsgd", "noise_multiplier": 1.0})
  with strategy.scope():
    inputs = keras.Input(shape=(TABLES,), dtype=tf.int64)
    vectors = [Embedding(VOCAB, DIM)(inputs[:, i]) for i in range(TABLES)]
    hidden = keras.layers.Dense(64, activation="relu")(keras.layers.Concatenate()(vectors))
    hidden = keras.layers.Dense(64, activation="relu")(hidden)
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.legacy.SGD(0.1),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    private = sparse_dp.make_private(model, sparse_dp.DPConfig(**config), num_examples=N,
                                     batch_size=args.batch_size)
  q = args.batch_size / N
  model.fit(private.poisson_dataset(ids, labels, epochs=args.warmup * q), verbose=0)
  start = time.perf_counter()
  model.fit(private.poisson_dataset(ids, labels, epochs=args.steps * q), verbose=0)
  seconds = time.perf_counter() - start
  if strategy.cluster_resolver.task_id == 0:
    print(json.dumps({"seconds": seconds, "steps": args.steps,
                      "examples_per_second": args.steps * args.batch_size / seconds}))


def launch(count: int, algorithm: str, args) -> dict:
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  addresses = [f"127.0.0.1:{s.getsockname()[1]}" for s in sockets]
  for s in sockets:
    s.close()
  processes = []
  for index in range(count):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
        {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}))
    processes.append(subprocess.Popen(
        [sys.executable, __file__, "--worker", "--algorithm", algorithm,
         "--batch-size", str(args.batch_size), "--steps", str(args.steps),
         "--warmup", str(args.warmup)], env=env, stdout=subprocess.PIPE, text=True))
  outputs = [p.communicate()[0] for p in processes]
  if any(p.returncode for p in processes):
    raise RuntimeError(f"{count} workers, {algorithm}: a worker failed")
  return {"workers": count, "algorithm": algorithm,
          **json.loads(outputs[0].strip().splitlines()[-1])}


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--algorithm", default="adafest")
  parser.add_argument("--batch-size", type=int, default=1024)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--out")
  args = parser.parse_args()
  if args.worker:
    return worker(args)
  import tensorflow as tf
  runs = [launch(count, algorithm, args) for algorithm in ("adafest", "dpsgd")
          for count in (1, 2)]
  result = {
      "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores shared with other "
                 "engineers' jobs (load average at start "
                 f"{os.getloadavg()[0]:.1f}); Python {platform.python_version()}, "
                 f"TensorFlow {tf.__version__}",
      "caveat": "both workers run on the same 2 shared cores over localhost gRPC: a second "
                "worker adds no compute here, only the all-reduce and a second process; "
                "these numbers show the overhead of the multi-worker path, not scaling",
      "model": f"{TABLES} tables x {VOCAB} rows x {DIM}, Dense 64-64-1, global expected "
               f"batch {args.batch_size}, {args.steps} timed steps after {args.warmup}",
      "runs": runs}
  text = json.dumps(result, indent=2)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      f.write(text + "\n")
  print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
