"""ParameterServerTraining on one device and on two mirrored replicas; prints JSON.

Run as a script: logical CPU devices must be configured before TensorFlow
starts, so ``test_parameter_servers.py`` runs this in a fresh process.
"""

import json
import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import sparse_dp  # noqa: E402
from sparse_dp.distribute import ParameterServerTraining  # noqa: E402
from tiny_model import tiny_model  # noqa: E402

VOCAB, BATCH, N, STEPS = 200, 64, 640, 2
NOISE = {"dpsgd": dict(noise_multiplier=1.0),
         "adafest": dict(sigma1=1.0, sigma2=1.0, threshold=1.5)}
CONFIGS = {"dpsgd": NOISE["dpsgd"], "fest": dict(NOISE["dpsgd"], selection_epsilon=0.5),
           "adafest": NOISE["adafest"], "adafest+": dict(NOISE["adafest"], selection_epsilon=0.5)}


def train(strategy, algorithm):
  rng = np.random.default_rng(0)
  ids = (rng.zipf(1.5, N) % VOCAB).astype("int64")
  labels = rng.integers(0, 2, (N, 1)).astype("float32")
  with strategy.scope():
    model = tiny_model(VOCAB)
    private = sparse_dp.make_private(
        model, sparse_dp.DPConfig(algorithm=algorithm, noise_seed=1, **CONFIGS[algorithm]),
        num_examples=N, batch_size=BATCH)
  logs = ParameterServerTraining(private, ids, labels).fit(steps=STEPS)
  return {"weights": [w.numpy().tolist() for w in model.trainable_weights],
          "counted": private.accountant.steps, "logs": logs}


if __name__ == "__main__":
  one = tf.distribute.OneDeviceStrategy("/cpu:0")
  # One strategy for all: a second one in this process would number its collectives anew.
  two = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  results = {}
  for name in CONFIGS:
    print("training", name, file=sys.stderr, flush=True)
    results[name] = {"one": train(one, name), "two": train(two, name)}
  print(json.dumps(results))
