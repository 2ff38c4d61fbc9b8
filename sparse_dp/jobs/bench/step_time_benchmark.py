"""Seconds per training step by vocabulary size (Ghazi et al., NeurIPS 2023, Table 4).

The model (docs/commands/bench.md): one embedding table of ``--dim`` (64),
one Zipf-distributed id per example (exponent 1.1), the embedding summed to
one logit, sigmoid cross-entropy, batch ``--batch-size`` (1024). Trainers:

* ``nonprivate``: plain Keras (``keras.layers.Embedding``), sparse updates;
* ``dpsgd-tfp``: TF Privacy 0.9.0 ``DPModel`` with its fast gradient clipping (on the
  Python 3.10-3.11 stack only: TF Privacy does not install with TF 2.16+);
* ``dpsgd``: sparse-dp's DP-SGD (dense noise on the whole table);
* ``adafest``: sparse-dp's DP-AdaFEST.

Each trainer and size runs in its own subprocess (``TF_ENABLE_ONEDNN_OPTS=0``,
so freed buffers do not inflate the resident memory), times ``--steps`` calls
of the compiled train function after warm-up, and reports the median.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time

TRAINERS = ("nonprivate", "dpsgd-tfp", "dpsgd", "adafest")
OPTIMIZERS = ("sgd", "adam", "adagrad")
_WARMUP_STEPS = 3
_NUM_EXAMPLES = 1_000_000_000  # the accounted N of the DP trainers


def add_parser(commands) -> None:
  parser = commands.add_parser("step", help="seconds per training step against vocabulary size",
                               description=__doc__.splitlines()[0])
  parser.add_argument("--vocab", default="100000,1000000,10000000",
                      help="comma-separated vocabulary sizes")
  parser.add_argument("--trainers", default=",".join(TRAINERS),
                      help=f"comma-separated, from {', '.join(TRAINERS)}")
  parser.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd")
  parser.add_argument("--dim", type=int, default=64)
  parser.add_argument("--batch-size", type=int, default=1024)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--clip", type=float, default=1.0, help="C1 and C2")
  parser.add_argument("--sigma1", type=float, default=1.414)
  parser.add_argument("--sigma2", type=float, default=1.414,
                      help="also the noise multiplier of the DP-SGD trainers")
  parser.add_argument("--tau", type=float, default=5.0)
  parser.add_argument("--xla", action="store_true",
                      help="compile the train step with XLA (model.compile(jit_compile=True)); "
                           "the DP trainers' batches are then padded to their capacity, as "
                           "poisson_dataset pads them")
  parser.add_argument("--timeout", type=float, default=1800, help="seconds per trainer and size")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.set_defaults(run=run)


def run(args) -> int:
  trainers = [t.strip() for t in args.trainers.split(",") if t.strip()]
  unknown = sorted(set(trainers) - set(TRAINERS))
  if unknown:
    raise ValueError(f"unknown trainer(s) {', '.join(unknown)}; choose from {', '.join(TRAINERS)}")
  if "dpsgd-tfp" in trainers and importlib.util.find_spec("tensorflow_privacy") is None:
    others = ",".join(t for t in trainers if t != "dpsgd-tfp") or "nonprivate,dpsgd,adafest"
    raise ValueError(
        "trainer dpsgd-tfp needs TF Privacy 0.9.0, which is not installed: it installs only "
        "with TensorFlow <= 2.15 on Python <= 3.11 (sparse-dp's Python 3.10-3.11 stack); run "
        f"it there, or leave it out: --trainers {others}")
  vocabularies = [int(float(v)) for v in args.vocab.split(",")]
  if any(v < 2 for v in vocabularies) or args.steps < 1 or args.batch_size < 1:
    raise ValueError("--vocab sizes must be >= 2, --steps and --batch-size >= 1")
  results = []
  for vocabulary in vocabularies:
    for trainer in trainers:
      settings = {**{k: getattr(args, k) for k in ("optimizer", "dim", "batch_size", "steps",
                                                    "clip", "sigma1", "sigma2", "tau", "xla")},
                  "trainer": trainer, "vocab": vocabulary}
      results.append(_in_subprocess(settings, args.timeout))
      if not args.json:
        _print_row(results[-1])
  report = {"benchmark": "step_time", "xla": args.xla, "optimizer": args.optimizer,
            "dim": args.dim,
            "batch_size": args.batch_size, "steps": args.steps, "results": results}
  if args.json:
    print(json.dumps(report))
  return 0


def _in_subprocess(settings: dict, timeout: float) -> dict:
  env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
  try:
    done = subprocess.run([sys.executable, "-m", "sparse_dp.jobs.bench.step_time_benchmark",
                           json.dumps(settings)],
                          capture_output=True, text=True, timeout=timeout, env=env)
  except subprocess.TimeoutExpired:
    return {**_key(settings), "error": f"timed out after {timeout:g} s"}
  if done.returncode != 0:
    return {**_key(settings), "error": done.stderr.strip().splitlines()[-1] if done.stderr else
            f"exit {done.returncode}"}
  return json.loads(done.stdout.strip().splitlines()[-1])


def _key(settings):
  return {"trainer": settings["trainer"], "vocab": settings["vocab"],
          "xla": settings.get("xla", False)}


def _print_row(result: dict) -> None:
  if "error" in result:
    print(f"{result['trainer']:>11} vocab {result['vocab']:>11,}: {result['error']}")
    return
  print(f"{result['trainer']:>11} vocab {result['vocab']:>11,}: "
        f"{result['seconds_per_step']:.4f} s/step, {result['peak_rss_mb']:,.0f} MB peak, "
        f"{result['nonzero_rows_per_step']:,.0f} nonzero rows/step", flush=True)


def measure(settings: dict) -> dict:
  """Builds one trainer, warms it up, and times its train function (in this process)."""
  import numpy as np
  import tensorflow as tf

  vocabulary, batch, steps = settings["vocab"], settings["batch_size"], settings["steps"]
  rng = np.random.default_rng(0)
  total = steps + _WARMUP_STEPS
  ids = (rng.zipf(1.1, (total, batch)) % vocabulary).astype("int64")
  labels = rng.integers(0, 2, (total, batch, 1)).astype("float32")
  model, private = _build(settings, tf)
  batches = tf.data.Dataset.from_tensor_slices((ids, labels))
  if settings.get("xla") and private is not None:
    batches = batches.map(lambda x, y: _padded(x, y, batch, tf))
  iterator = iter(batches.repeat())
  train = model.make_train_function()
  seconds, nonzero, first_step = [], [], None
  for step in range(total):
    if step == _WARMUP_STEPS and private is not None:
      private.run_statistics.reset()  # the timed steps' update sizes
    start = time.perf_counter()
    train(iterator)
    elapsed = time.perf_counter() - start
    if step == 0:
      first_step = elapsed  # tracing and compiling included
    if step >= _WARMUP_STEPS:
      seconds.append(elapsed)
      # Without DP, the rows a step's gradient has (every row for a dense one).
      nonzero.append(len(np.unique(ids[step])) if settings["trainer"] == "nonprivate"
                     else vocabulary)
  if private is not None:
    nonzero = [private.run_statistics.result()["nonzero_rows"]]
  return {"trainer": settings["trainer"], "vocab": vocabulary, "xla": settings.get("xla", False),
          "first_step_seconds": first_step, "seconds_per_step": statistics.median(seconds),
          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
          "nonzero_rows_per_step": statistics.mean(nonzero)}


def _padded(ids, labels, batch: int, tf):
  """A batch of ``batch`` examples as the DP step meets it under XLA: padded to its capacity.

  The capacity of a Poisson batch of expected size ``batch`` of the
  ``_NUM_EXAMPLES`` the trainers account
  (:func:`sparse_dp.training.poisson.poisson_sampling.batch_capacity`; 1,329 rows for 1,024), the
  padding rows masked out.
  """
  from sparse_dp.training.poisson import padded_batches
  from sparse_dp.training.poisson.poisson_sampling import batch_capacity

  capacity = batch_capacity(_NUM_EXAMPLES, batch / _NUM_EXAMPLES)
  in_batch = tf.range(capacity) < batch
  return padded_batches.padded(pad_rows((ids, labels), capacity - batch, tf), in_batch)


def pad_rows(batch, extra: int, tf):
  """Every tensor of ``batch`` with ``extra`` copies of its first row appended."""
  return tf.nest.map_structure(lambda t: tf.concat([t, tf.repeat(t[:1], extra, axis=0)], 0),
                               batch)


def _build(settings: dict, tf):
  """``(compiled model, its PrivateTraining)`` for one trainer (``None``: not DP here)."""
  from sparse_dp._keras import keras
  from sparse_dp.layers import Embedding
  from sparse_dp.optimizers import sparse_optimizer
  from sparse_dp.training import DPConfig, make_private

  trainer, vocabulary, dim = settings["trainer"], settings["vocab"], settings["dim"]
  optimizer = sparse_optimizer({"sgd": keras.optimizers.legacy.SGD(0.1),
                                "adam": keras.optimizers.Adam(0.001),
                                "adagrad": keras.optimizers.legacy.Adagrad(0.1)}
                               [settings["optimizer"]])
  loss = keras.losses.BinaryCrossentropy(from_logits=True)
  ids = keras.Input(shape=(), dtype=tf.int64)
  plain = trainer in ("nonprivate", "dpsgd-tfp")
  table = (keras.layers.Embedding(vocabulary, dim) if plain else Embedding(vocabulary, dim))
  logit = keras.layers.Lambda(lambda e: tf.reduce_sum(e, -1, keepdims=True))(table(ids))
  if trainer == "dpsgd-tfp":
    import tensorflow_privacy
    from tensorflow_privacy.privacy.fast_gradient_clipping import layer_registry
    model = tensorflow_privacy.DPModel(
        l2_norm_clip=settings["clip"], noise_multiplier=settings["sigma2"], use_xla=False,
        layer_registry=layer_registry.make_default_layer_registry(), inputs=ids, outputs=logit)
    model.compile(optimizer=optimizer, loss=loss)
    return model, None
  model = keras.Model(ids, logit)
  model.compile(optimizer=optimizer, loss=loss, jit_compile=settings.get("xla", False))
  if trainer == "nonprivate":
    return model, None
  config = (DPConfig("dpsgd", l2_norm_clip=settings["clip"], noise_multiplier=settings["sigma2"])
            if trainer == "dpsgd" else
            DPConfig("adafest", l2_norm_clip=settings["clip"], contribution_clip=settings["clip"],
                     sigma1=settings["sigma1"], sigma2=settings["sigma2"],
                     threshold=settings["tau"]))
  return model, make_private(model, config, num_examples=_NUM_EXAMPLES,
                             batch_size=settings["batch_size"])


if __name__ == "__main__":
  print(json.dumps(measure(json.loads(sys.argv[1]))))
