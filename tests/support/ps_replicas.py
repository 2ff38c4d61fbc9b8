"""ParameterServerTraining on one device and on two mirrored replicas; prints JSON.

Run as a script, or imported first by ``ps_steps.py`` (which runs :func:`replica_results`
before it starts its cluster): logical CPU devices must be configured before TensorFlow
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
  """``STEPS`` steps: the results, and the trainer (restarted and writes_after_count read it)."""
  training = trainer(strategy, algorithm)
  logs = training.fit(steps=STEPS)
  return {"weights": [w.numpy().tolist() for w in training.model.trainable_weights],
          "counted": training.private.accountant.steps, "logs": logs}, training


def restarted(strategy, first, keys, folder):
  """The ``keys`` of ``first``'s two steps (dpsgd on ``strategy``, from a fresh model), then
  of two more by a new model restored from its checkpoint (the same noise seed, as
  ``--noise-seed`` after a restart)."""
  first.model.save_weights(os.path.join(folder, "weights"))
  second = trainer(strategy, "dpsgd", resume_from=os.path.join(folder, "weights"))
  second.model.load_weights(os.path.join(folder, "weights"))
  return {"first": keys, "restored": second.fit(steps=STEPS)["keys"]}


def writes_after_count(strategy, training):
  """In the graph of ``training``'s step (the one its fit ran): the ops that write a trained
  weight (every replica's copy), and how many of them have an op that counts the step (writes
  ``steps_taken``) before them."""
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


def replica_results() -> dict:
  """Every algorithm on one device and on two mirrored replicas, a restart, the steps' order."""
  one = tf.distribute.OneDeviceStrategy("/cpu:0")
  # One strategy for all: a second one in this process would number its collectives anew.
  two = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  results, trainers = {}, {}
  for name in CONFIGS:
    print("training", name, file=sys.stderr, flush=True)
    (alone, trainers[name, 1]), (split, trainers[name, 2]) = train(one, name), train(two, name)
    results[name] = {"one": alone, "two": split}
  # The steps checked are the ones trained above: no model or trace more.
  keys = results["dpsgd"]["one"]["logs"]["keys"]
  results["restarted"] = restarted(one, trainers["dpsgd", 1], keys, tempfile.mkdtemp())
  results["ordered"] = {name: writes_after_count(two, trainers[name, 2])
                        for name in ("dpsgd", "adafest")}
  return results


if __name__ == "__main__":
  print(json.dumps(replica_results()))
