"""One worker of a two-worker MultiWorkerMirroredStrategy job (``TF_CONFIG`` set by the test).

Each algorithm trains a few DP steps on the cluster with no ``noise_seed``
(each worker draws its own, ``make_private`` must share worker 0's) on the
run's Poisson batches (each global batch split across the workers), each
worker with its own TensorFlow global seed (which the batches must not depend
on). Then worker 1 makes one Poisson dataset more than worker 0 before both
fit: ``fit`` must refuse on both; and both must refuse Poisson batches whose
auto-shard policy was set to ``OFF``. Last, each worker trains one
algorithm's model in its process alone (worker 0 DP-SGD, worker 1 DP-AdaFEST,
side by side), with the seed the cluster shared, hence the same global batches.
Prints the results as one JSON line.
"""

import json
import sys

import numpy as np
import tensorflow as tf
from tiny_model import tiny_model  # noqa: E402

import sparse_dp  # noqa: E402

VOCAB, BATCH, STEPS, N = 200, 64, 3, 640
CONFIGS = {
    "dpsgd": {"algorithm": "dpsgd", "noise_multiplier": 1.0},
    "adafest": {"algorithm": "adafest", "sigma1": 1.0, "sigma2": 1.0, "threshold": 1.5},
}


def data():
  rng = np.random.default_rng(0)
  ids = (rng.zipf(1.5, N) % VOCAB).astype("int64")
  return ids, rng.integers(0, 2, (N, 1)).astype("float32")


def private_model(strategy, config, noise_seed):
  with strategy.scope():
    model = tiny_model(VOCAB)  # sets the global seed to 5
    private = sparse_dp.make_private(
        model, sparse_dp.DPConfig(noise_seed=noise_seed, **config), num_examples=N,
        batch_size=BATCH)
  return model, private


def train(strategy, config, noise_seed, global_seed):
  ids, labels = data()
  model, private = private_model(strategy, config, noise_seed)
  tf.random.set_seed(global_seed)
  dataset = private.poisson_dataset(ids, labels, epochs=STEPS * BATCH / N)
  history = model.fit(dataset, epochs=1, verbose=0)
  return {"weights": [w.numpy().tolist() for w in model.trainable_weights],
          "seed": private.seed, "steps": private.accountant.steps,
          "poisson": private.poisson_sampling,
          "nonzero_rows": history.history["nonzero_rows"][-1]}


def main():
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  worker = strategy.cluster_resolver.task_id
  results = {name: {"cluster": train(strategy, config, None, global_seed=1 + worker)}
             for name, config in CONFIGS.items()}
  model, private = private_model(strategy, CONFIGS["dpsgd"], None)
  ids, labels = data()
  if worker == 1:
    private.poisson_dataset(ids, labels)
  try:
    model.fit(private.poisson_dataset(ids, labels, epochs=BATCH / N), verbose=0)
    results["extra_dataset"] = {"steps": private.accountant.steps}
  except ValueError as error:
    results["extra_dataset"] = {"refused": str(error), "steps": private.accountant.steps}
  model, private = private_model(strategy, CONFIGS["dpsgd"], None)
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
  try:  # every worker would take the same slices of each batch
    model.fit(private.poisson_dataset(ids, labels, epochs=BATCH / N).with_options(options),
              verbose=0)
    results["unsliced"] = {"steps": private.accountant.steps}
  except ValueError as error:
    results["unsliced"] = {"refused": str(error), "steps": private.accountant.steps}
  # The cluster's work is done: each worker trains one reference alone, both at once.
  name = list(CONFIGS)[worker]
  results[name]["alone"] = train(tf.distribute.OneDeviceStrategy("/cpu:0"), CONFIGS[name],
                                 results[name]["cluster"]["seed"], global_seed=3)
  print(json.dumps(results))


if __name__ == "__main__":
  sys.exit(main())
