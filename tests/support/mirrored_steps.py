"""Trains a few DP steps on one device and on two mirrored replicas; prints the weights.

Run as a script: logical CPU devices must be configured before TensorFlow
starts, so ``test_distribute.py`` runs this in a fresh process, once for all its
configurations (a JSON list in ``argv[1]``): one TensorFlow start, one strategy of each kind.
"""

import json
import sys

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from tiny_model import tiny_model  # noqa: E402

import sparse_dp  # noqa: E402
from sparse_dp.mechanisms.noise import dense_noise  # noqa: E402
from sparse_dp.optimizers import RowwiseAdagrad  # noqa: E402

VOCAB, BATCH = 200, 64
SINGLE_DRAW = dense_noise.CHUNK_ROWS  # the default: a configuration's "chunk_rows" is its own


def train(strategy, config):
  config = dict(config)
  optimizer = config.pop("optimizer", None)
  dense_noise.CHUNK_ROWS = config.pop("chunk_rows", SINGLE_DRAW)
  rng = np.random.default_rng(0)
  ids = (rng.zipf(1.5, BATCH * 3) % VOCAB).astype("int64")
  labels = rng.integers(0, 2, (BATCH * 3, 1)).astype("float32")
  with strategy.scope():
    model = tiny_model(VOCAB)
    if optimizer == "rowwise-adagrad":
      model.compile(optimizer=RowwiseAdagrad(0.5), loss=model.loss)
    private = sparse_dp.make_private(model, sparse_dp.DPConfig(noise_seed=1, **config),
                                     num_examples=10_000, batch_size=BATCH)
  dataset = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(BATCH)
  history = model.fit(dataset, epochs=1, verbose=0, shuffle=False)
  return {"weights": [w.numpy().tolist() for w in model.trainable_weights],
          "steps": private.accountant.steps,
          "nonzero_rows": history.history["nonzero_rows"][-1]}


if __name__ == "__main__":
  one = tf.distribute.OneDeviceStrategy("/cpu:0")
  # One strategy for all: a second one in this process would number its collectives anew.
  two = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  results = []
  for config in json.loads(sys.argv[1]):
    print("training", config, file=sys.stderr, flush=True)
    results.append({"one": train(one, config), "two": train(two, config)})
  print(json.dumps(results))
