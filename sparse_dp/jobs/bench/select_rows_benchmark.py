"""Seconds per DP-AdaFEST row selection against vocabulary size, written as JSON.

One batch of Zipf-distributed ids (exponent 1.1) builds a contribution map;
``select_rows`` then thresholds it with noise and draws false positives by
geometric skips. With the expected number of false positives held fixed
(``--false-positives``, by setting tau), time should stay flat from 1e5 to
1e9 rows; with tau fixed it grows only with the rows selected.

    sparse-dp bench select-rows --out select_rows.json
"""

from __future__ import annotations

import json
import platform
import resource
import statistics
import time


def measure(vocabulary: int, tau: float, noise_std: float, batch: int, steps: int) -> dict:
  import numpy as np
  import tensorflow as tf

  from sparse_dp.mechanisms import contribution_maps, false_positive_probability, select_rows

  ids = tf.constant(np.random.default_rng(0).zipf(1.1, batch) % vocabulary, tf.int64)

  @tf.function
  def step(seed):
    (contribution,) = contribution_maps([ids], 1.0)
    return select_rows(contribution, vocabulary, tau, noise_std, seed).rows

  seed = tf.constant([0, 0], tf.int64)
  for warmup in range(3):
    step(seed + warmup).numpy()
  seconds, selected = [], []
  for i in range(steps):
    start = time.perf_counter()
    rows = step(seed + 100 + i).numpy()
    seconds.append(time.perf_counter() - start)
    selected.append(rows.size)
  return {"vocab": vocabulary, "tau": tau, "seconds_per_step": statistics.median(seconds),
          "rows_selected_per_step": statistics.mean(selected),
          "false_positive_probability": false_positive_probability(tau, noise_std),
          "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def add_parser(commands) -> None:
  parser = commands.add_parser("select-rows", help="seconds per row selection against vocabulary",
                               description=__doc__.splitlines()[0])
  parser.add_argument("--vocab", default="100000,1000000,10000000,100000000,1000000000")
  parser.add_argument("--tau", type=float, default=5.0, help="fixed threshold run")
  parser.add_argument("--false-positives", type=float, default=1000.0,
                      help="expected false positives of the fixed-count run")
  parser.add_argument("--sigma1", type=float, default=1.414)
  parser.add_argument("--clip", type=float, default=1.0, help="C1")
  parser.add_argument("--batch-size", type=int, default=1024)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--out", help="write the JSON here as well as to stdout")
  parser.set_defaults(run=run)


def run(args) -> int:
  import tensorflow as tf
  from scipy import stats

  noise_std = args.sigma1 * args.clip
  results = []
  for vocabulary in (int(float(v)) for v in args.vocab.split(",")):
    fixed_count_tau = noise_std * stats.norm.isf(args.false_positives / vocabulary)
    for tau in (args.tau, fixed_count_tau):
      results.append(measure(vocabulary, tau, noise_std, args.batch_size, args.steps))
  report = {"benchmark": "select_rows", "machine": platform.processor() or platform.machine(),
            "tensorflow": tf.__version__, "batch_size": args.batch_size,
            "noise_std": noise_std, "results": results}
  text = json.dumps(report, indent=2)
  print(text)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text + "\n")
  return 0
