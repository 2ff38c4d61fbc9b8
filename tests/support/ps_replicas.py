"""ParameterServerTraining on one device and on two mirrored replicas; prints JSON.

Run as a script: logical CPU devices must be configured before TensorFlow
starts, so ``test_parameter_servers.py`` runs this in a fresh process.
"""

import json
import os
import sys
import tempfile

import numpy as np
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from graph_ops import ancestors  # noqa: E402
from tiny_model import tiny_model  # noqa: E402

import sparse_dp  # noqa: E402
from sparse_dp.distribute import ParameterServerTraining  # noqa: E402

VOCAB, BATCH, N, STEPS = 200, 64, 640, 2
NOISE = {"dpsgd": dict(noise_multiplier=1.0),
         "adafest": dict(sigma1=1.0, sigma2=1.0, threshold=1.5)}
CONFIGS = {"dpsgd": NOISE["dpsgd"], "fest": dict(NOISE["dpsgd"], selection_epsilon=0.5),
           "adafest": NOISE["adafest"], "adafest+": dict(NOISE["adafest"], selection_epsilon=0.5)}


def trainer(strategy, algorithm, resume_from=None):
  rng = np.random.default_rng(0)
  ids = (rng.zipf(1.5, N) % VOCAB).astype("int64")
  labels = rng.integers(0, 2, (N, 1)).astype("float32")
  with strategy.scope():
    model = tiny_model(VOCAB)
    private = sparse_dp.make_private(
        model, sparse_dp.DPConfig(algorithm=algorithm, noise_seed=1, **CONFIGS[algorithm]),
        num_examples=N, batch_size=BATCH, resume_from=resume_from)
  return ParameterServerTraining(private, ids, labels)


def train(strategy, algorithm):
  training = trainer(strategy, algorithm)
  logs = training.fit(steps=STEPS)
  return {"weights": [w.numpy().tolist() for w in training.model.trainable_weights],
          "counted": training.private.accountant.steps, "logs": logs}


def restarted(strategy, folder):
  """The keys of two steps, then of two more by a new model restored from the first's
  checkpoint (the same noise seed, as ``--noise-seed`` after a restart)."""
  first = trainer(strategy, "dpsgd")
  keys = first.fit(steps=STEPS)["keys"]
  first.model.save_weights(os.path.join(folder, "weights"))
  second = trainer(strategy, "dpsgd", resume_from=os.path.join(folder, "weights"))
  second.model.load_weights(os.path.join(folder, "weights"))
  return {"first": keys, "restored": second.fit(steps=STEPS)["keys"]}


def writes_after_count(strategy, algorithm):
  """In the step's graph: the ops that write a trained weight (every replica's copy),
  and how many of them have an op that counts the step (writes ``steps_taken``) before them."""
  training = trainer(strategy, algorithm)
  graph = training._step.get_concrete_function().graph
  inside = {id(outer): inner for outer, inner in graph.captures}

  def handles(variables):
    return {inside[id(copy.handle)].ref() for variable in variables
            for copy in strategy.experimental_local_results(variable)}

  def writing(variables):
    refs = handles(variables)
    return [op for op in graph.get_operations()
            if any(word in op.type for word in ("Assign", "Apply", "Scatter", "CountUpTo"))
            and any(tensor.ref() in refs for tensor in op.inputs)]

  counts = set(writing([training.private.steps_taken]))
  writes = writing(training.model.trainable_weights)
  return {"writes": len(writes), "after_count": sum(bool(counts & ancestors(op)) for op in writes)}


if __name__ == "__main__":
  one = tf.distribute.OneDeviceStrategy("/cpu:0")
  # One strategy for all: a second one in this process would number its collectives anew.
  two = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  results = {}
  for name in CONFIGS:
    print("training", name, file=sys.stderr, flush=True)
    results[name] = {"one": train(one, name), "two": train(two, name)}
  results["restarted"] = restarted(one, tempfile.mkdtemp())
  # After the training above: tracing numbers the strategy's collectives too.
  results["ordered"] = {name: writes_after_count(two, name) for name in ("dpsgd", "adafest")}
  print(json.dumps(results))
