"""The pCTR job's examples per second and peak memory at 1x, 10x and 100x Table 3.

Usage (the committed result, ``benchmarks/results/vocabulary_scale.{json,png}``)::

    python benchmarks/vocabulary_scale.py --scales 1,10,100 \\
        --out benchmarks/results/vocabulary_scale.json

The model and step are ``sparse-dp train``'s (:func:`sparse_dp.models.pctr.build_pctr_model`
at Table 3's vocabularies times the scale, the job's epsilon-1 calibration, its Poisson
batches through ``model.fit``), on a day of :class:`sparse_dp.data.synthetic.SyntheticCriteo`
at the same scale. Each algorithm and scale trains in its own subprocess: examples per second
over the timed steps after ``--warmup``, resident memory before the first step and its peaks
over the warm-up and the timed steps; a child whose memory would not fit is not started. See
docs/vocabulary_scale.md ("How it runs").
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

from sparse_dp.jobs.train.job_flags import OPTIMIZERS

ALGORITHMS = ("none", "dpsgd", "adafest")


def optimizer(name: str, learning_rate: float):
  """The job's ``--optimizer name`` in its sparse form for every run, non-private included
  (:func:`sparse_dp.optimizers.sparse_optimizer`), so the three runs differ only in the step."""
  from sparse_dp.jobs.train.fitting import job_optimizer
  from sparse_dp.optimizers import sparse_optimizer
  return sparse_optimizer(job_optimizer(name, learning_rate))


def available_bytes() -> int:
  """``MemAvailable`` of ``/proc/meminfo``: what can be used without swapping others out."""
  return _field_bytes("/proc/meminfo", "MemAvailable")


def _field_bytes(path: str, field: str) -> int:
  """A ``kB`` field of ``/proc/meminfo`` or ``/proc/self/status``, in bytes."""
  for line in pathlib.Path(path).read_text().splitlines():
    if line.startswith(field + ":"):
      return int(line.split()[1]) * 1024
  raise RuntimeError(f"no {field} in {path}")


def measure(settings: dict) -> dict:
  """One algorithm at one scale, in this process: the child's JSON line (``not_run``
  and why, when the machine has not the memory it needs)."""
  import numpy as np

  import sparse_dp
  from sparse_dp._keras import keras
  from sparse_dp.accounting import Algorithm
  from sparse_dp.data.synthetic import SyntheticCriteo
  from sparse_dp.jobs.train import fitting, memory
  from sparse_dp.jobs.train.job_flags import FitSettings
  from sparse_dp.models.pctr import build_pctr_model

  scale, algorithm, examples = settings["scale"], settings["algorithm"], settings["examples"]
  synthetic = SyntheticCriteo(scale=scale, seed=settings["seed"])
  sizes = list(synthetic.vocabulary_sizes)
  tables = {"table_rows": sum(sizes), "table_bytes": memory.table_bytes(sizes)}
  needed = memory.bytes_needed(sizes, algorithm, settings["optimizer"])
  free = available_bytes()
  usable = free - settings["reserve_gb"] * 2**30
  if needed > usable:
    return {**settings, **tables, "not_run": (
        f"needs at least {memory.describe_needs(sizes, algorithm, settings['optimizer'])}, "
        f"{usable / 2**30:.1f} GiB usable: MemAvailable {free / 2**30:.1f} GiB less "
        f"{settings['reserve_gb']:g} GiB left to others")}
  fit = FitSettings(batch_size=settings["batch_size"], noise_seed=settings["seed"],
                    learning_rate=settings["learning_rate"], seed=settings["seed"])
  day = synthetic.examples(1, examples)
  x = {"integers": np.log1p(np.where(day["integer_missing"], 0, day["integers"])).astype("float32"),
       "categorical": np.maximum(day["buckets"], 0)}
  y = day["labels"].astype("float32")[:, None]
  del day
  keras.utils.set_random_seed(settings["seed"])
  model = build_pctr_model(sizes)
  model.compile(optimizer=optimizer(settings["optimizer"], settings["learning_rate"]),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  config = fitting._dp_config(Algorithm.parse(algorithm), fit, examples, fit.batch_size, sizes)
  private = sparse_dp.make_private(model, config, num_examples=examples,
                                   batch_size=fit.batch_size, epochs=fit.epochs)
  clock = StepClock(model, settings["warmup"], settings["min_steps"], settings["max_seconds"])
  callbacks = ([private.callback()] if private.is_private else []) + [
      keras.callbacks.LambdaCallback(on_train_batch_begin=clock.begin,
                                     on_train_batch_end=clock.end)]
  total = settings["warmup"] + settings["steps"]
  batches = private.poisson_dataset(x, y, epochs=total * fit.batch_size / examples)
  rss_before = _field_bytes("/proc/self/status", "VmRSS")
  model.fit(batches.take(total), callbacks=callbacks, verbose=0)
  steps, seconds = len(clock.timed), sum(clock.timed)
  return {
      **settings, **tables, "bytes_needed_estimate": needed, "mem_available_at_start": free,
      "timed_steps": steps, "timed_seconds": seconds,
      "examples_per_second": steps * fit.batch_size / seconds if steps else None,
      "seconds_per_step": seconds / steps if steps else None,
      "first_step_seconds": clock.first_step,
      "rss_before_steps_bytes": rss_before,
      "peak_rss_warmup_bytes": clock.warmup_peak,
      "peak_rss_timed_bytes": _field_bytes("/proc/self/status", "VmHWM"),
      "rss_after_each_timed_step_bytes": clock.rss,
      "nonzero_rows_per_step": (private.run_statistics.result()["nonzero_rows"]
                                if private.is_private else None),
  }


class StepClock:
  """Seconds of each timed step and the resident set after it; the warm-up's peak
  resident set (``VmHWM``, then reset to the current resident set for the timed steps).

  ``begin`` and ``end`` are a Keras callback's ``on_train_batch_begin/end``; after
  ``min_steps`` timed steps, training stops once ``max_seconds`` are timed.
  """

  def __init__(self, model, warmup: int, min_steps: int, max_seconds: float):
    self.model, self.warmup, self.min_steps, self.max_seconds = (model, warmup, min_steps,
                                                                 max_seconds)
    self.timed, self.rss, self.first_step, self.warmup_peak = [], [], None, None
    self._start = 0.0

  def begin(self, batch, logs=None):
    self._start = time.perf_counter()

  def end(self, batch, logs=None):
    elapsed = time.perf_counter() - self._start
    if batch == 0:
      self.first_step = elapsed
    if batch + 1 == self.warmup:
      self.warmup_peak = _field_bytes("/proc/self/status", "VmHWM")
      pathlib.Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux >= 4.0)
    elif batch >= self.warmup:
      self.timed.append(elapsed)
      self.rss.append(_field_bytes("/proc/self/status", "VmRSS"))
      if len(self.timed) >= self.min_steps and sum(self.timed) >= self.max_seconds:
        self.model.stop_training = True


def _child(settings: dict, timeout: float) -> dict:
  env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}
  command = [sys.executable, __file__, "--child", json.dumps(settings)]
  started = time.perf_counter()
  try:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)
  except subprocess.TimeoutExpired:
    return {**settings, "error": f"timed out after {timeout:g} s"}
  if done.returncode != 0:
    return {**settings, "error": f"exit {done.returncode}: {done.stderr.strip()[-1500:]}"}
  return {**json.loads(done.stdout.strip().splitlines()[-1]),
          "child_wall_seconds": time.perf_counter() - started}


def plot(results: list[dict], path: pathlib.Path) -> None:
  """Examples per second and peak resident memory against table rows, per algorithm."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  figure, (speed, memory) = plt.subplots(1, 2, figsize=(10, 3.8))
  for algorithm in ALGORITHMS:
    ran = sorted((r for r in results if r["algorithm"] == algorithm and "error" not in r
                  and "not_run" not in r), key=lambda r: r["table_rows"])
    if not ran:
      continue
    rows = [r["table_rows"] for r in ran]
    speed.plot(rows, [r["examples_per_second"] for r in ran], marker="o", label=algorithm)
    memory.plot(rows, [max(r["peak_rss_timed_bytes"], r["peak_rss_warmup_bytes"]) / 2**30
                       for r in ran], marker="o", label=algorithm)
  for axis, label in ((speed, "examples / second"), (memory, "peak resident memory (GiB)")):
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("embedding rows (26 tables)")
    axis.set_ylabel(label)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
  figure.suptitle("pCTR job at 1x / 10x / 100x Table 3 (" + results[0]["optimizer"] + ")")
  figure.tight_layout()
  figure.savefig(path)
  plt.close(figure)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--child", help=argparse.SUPPRESS)
  parser.add_argument("--scales", default="1,10,100", help="multiples of Table 3's vocabularies")
  parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
  parser.add_argument("--optimizer", choices=OPTIMIZERS, default="sgd",
                      help="sgd (default; no slot), rowwise-adagrad (one scalar per row), adagrad "
                           "(one slot the size of the tables), adam or lazy-adam (two)")
  parser.add_argument("--learning-rate", type=float, default=3e-3)
  parser.add_argument("--examples", type=int, default=400_000,
                      help="synthetic examples in memory (N of the accounting)")
  parser.add_argument("--batch-size", type=int, default=2048)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--steps", type=int, default=40, help="timed steps at most")
  parser.add_argument("--min-steps", type=int, default=3, help="timed steps at least")
  parser.add_argument("--max-seconds", type=float, default=60.0,
                      help="stop timing once this many seconds of steps are timed")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--reserve-gb", type=float, default=4.0,
                      help="memory left to other users of the machine")
  parser.add_argument("--timeout", type=float, default=3600, help="seconds per child")
  parser.add_argument("--out", default="benchmarks/results/vocabulary_scale.json")
  parser.add_argument("--figure-of", nargs="+", metavar="JSON",
                      help="train nothing: draw the trained results of these earlier runs' JSON "
                           "files in one figure, --out with the suffix .png")
  args = parser.parse_args()
  if args.child:
    print(json.dumps(measure(json.loads(args.child))))
    return 0
  if args.figure_of:
    plot([r for path in args.figure_of
          for r in json.loads(pathlib.Path(path).read_text())["results"]],
         pathlib.Path(args.out).with_suffix(".png"))
    return 0
  algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
  unknown = sorted(set(algorithms) - set(ALGORITHMS))
  if unknown or not algorithms:
    parser.error(f"--algorithms: unknown {unknown}; choose from {','.join(ALGORITHMS)}")
  results = []
  for scale in [float(s) for s in args.scales.split(",")]:
    for algorithm in algorithms:
      settings = {"scale": scale, "algorithm": algorithm,
                  **{k: getattr(args, k) for k in ("optimizer", "learning_rate", "examples",
                                                    "batch_size", "warmup", "steps",
                                                    "min_steps", "max_seconds", "seed",
                                                    "reserve_gb")}}
      results.append(_child(settings, args.timeout))
      print(json.dumps({k: v for k, v in results[-1].items()
                        if k != "rss_after_each_timed_step_bytes"}), file=sys.stderr, flush=True)
  out = pathlib.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  for scale in {r["scale"] for r in results}:
    ran = {r["algorithm"]: r for r in results if r["scale"] == scale and r.get("timed_steps")}
    if "none" in ran and "adafest" in ran:
      for r in results:
        if r["scale"] == scale and r is ran["adafest"]:
          r["examples_per_second_over_nonprivate"] = (r["examples_per_second"]
                                                      / ran["none"]["examples_per_second"])
  report = {"benchmark": "vocabulary_scale", "command": " ".join(sys.argv),
            "machine": f"{platform.node()} {os.cpu_count()} cores, "
                       f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f}"
                       " GiB",
            "python": platform.python_version(), "results": results}
  out.write_text(json.dumps(report, indent=1))
  plot(results, out.with_suffix(".png"))
  return 0


if __name__ == "__main__":
  sys.exit(main())
