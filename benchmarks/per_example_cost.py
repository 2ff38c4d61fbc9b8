"""Cost of computing each example's loss alone in the DP step.

Times the DP step of two source trees in one run: this repository (the per-example step:
``tf.vectorized_map`` over the examples of a dense batch) and a baseline revision
(``--baseline-rev``, default ``e069d01``: one forward and backward pass over the whole
batch), checked out with ``git worktree add --detach`` into a temporary folder and removed at
the end. Settings: ``table4-<trainer>-<vocab>``, the step-time model of Ghazi et al., NeurIPS
2023, App. D.2.1 (Table 4); ``pctr-<algorithm>``, the model of ``sparse-dp train`` with its
default settings (``pctr-none``, the non-private step, for reference). Each measurement runs
in its own subprocess, the trees alternating; reported per setting: each tree's median
seconds per step and their ratio. See benchmarks/README.md ("per_example_cost.py").

  python benchmarks/per_example_cost.py --out benchmarks/results/per_example_cost.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
_NAMESPACE_LINKS = ("models", "data")  # setup.py installs them as sparse_dp.models / .data

# (trainer, vocabulary, timed steps): fewer steps where one step takes seconds.
TABLE4 = [(trainer, vocab, steps) for vocab, steps in ((100_000, 10), (1_000_000, 3),
                                                       (10_000_000, 1))
          for trainer in ("dpsgd", "adafest")]
PCTR = [("none", 5), ("dpsgd", 5), ("adafest", 5)]  # (algorithm, timed steps)
PCTR_WARMUP_STEPS = 2
FIRST_STEP_PARTS = ("make_private_seconds", "trace_seconds", "first_run_seconds",
                    "first_step_seconds", "graph_nodes")


def _settings() -> dict:
  """Every setting by name: ``(kind, worker settings)``."""
  table4 = {f"table4-{t}-{v:.0e}".replace("+0", ""): (
      "table4", {"trainer": t, "vocab": v, "steps": s, "optimizer": "sgd", "dim": 64,
                 "batch_size": 1024, "clip": 1.0, "sigma1": 1.414, "sigma2": 1.414, "tau": 5.0})
            for t, v, s in TABLE4}
  pctr = {f"pctr-{a}": ("pctr", {"algorithm": a, "steps": s, "warmup_steps": PCTR_WARMUP_STEPS})
          for a, s in PCTR}
  return {**table4, **pctr}


def main(argv=None) -> int:
  settings = _settings()
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="JSON file to write")
  parser.add_argument("--baseline-rev", default="e069d01")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--settings", default=",".join(settings),
                      help="comma-separated subset of: " + ", ".join(settings))
  parser.add_argument("--timeout", type=float, default=900, help="seconds per measurement")
  args = parser.parse_args(argv)
  chosen = [s.strip() for s in args.settings.split(",") if s.strip()]
  unknown = sorted(set(chosen) - set(settings))
  if unknown or args.repeats < 1:
    parser.error(f"unknown setting(s) {unknown}" if unknown else "--repeats must be >= 1")
  started = time.time()
  report = {"benchmark": "per_example_cost", "command": " ".join([sys.executable] + sys.argv),
            "current": _revision(REPO), "load_average_start": os.getloadavg(),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                        "python": platform.python_version()},
            "repeats": args.repeats, "order": "per repeat and setting: baseline, then current",
            "environment": {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"},
            "worker_command": "cd TREE && PYTHONPATH=TREE TF_ENABLE_ONEDNN_OPTS=0 "
                              f"TF_CPP_MIN_LOG_LEVEL=2 {sys.executable} {pathlib.Path(__file__)} "
                              "--worker KIND 'SETTINGS_JSON'",
            "notes": "table4 runs the tree's sparse_dp.jobs.bench.step_time_benchmark.measure "
                     "(3 warm-up steps, then 'steps' timed; fewer at 1e6 and 1e7 rows, where "
                     "DP-SGD takes seconds per step); pctr: 'warmup_steps' then 'steps' timed. The "
                     "machine is shared with other engineers' tests: the interleaving spreads "
                     "their load over both trees, the repeat ratios show what is left of it."}
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up the baseline tree
  with _baseline_tree(args.baseline_rev) as baseline:
    report["baseline"] = _revision(baseline)
    trees = {"baseline": baseline, "current": REPO}
    runs = {name: {"baseline": [], "current": []} for name in chosen}
    with _namespace_links(REPO), _namespace_links(baseline):
      for repeat in range(args.repeats):
        for name in chosen:
          for tree in ("baseline", "current"):
            result = _in_subprocess(trees[tree], *settings[name], args.timeout)
            runs[name][tree].append(result)
            print(f"repeat {repeat + 1} {name:>20} {tree:>8}: "
                  f"{_seconds_text(result)}", file=sys.stderr, flush=True)
        # Written after every repeat: a run stopped part-way keeps the repeats it finished.
        _write(report, runs, settings, repeat + 1, started, pathlib.Path(args.out))
  for name, summary in report["settings"].items():
    print(f"{name:>20}: {summary['ratio'] or float('nan'):.3f}x, median of repeats "
          f"{summary.get('median_repeat_ratio') or float('nan'):.3f}x "
          f"(repeats {summary['repeat_ratios']})")
  return 0


def _write(report: dict, runs: dict, settings: dict, repeats: int, started: float,
           out: pathlib.Path) -> None:
  report["repeats_completed"] = repeats
  report["tensorflow"] = next((r["tensorflow"] for by_tree in runs.values()
                               for results in by_tree.values() for r in results
                               if "tensorflow" in r), None)
  report["settings"] = {name: {"kind": settings[name][0], **settings[name][1],
                               **_summary(by_tree)} for name, by_tree in runs.items()}
  report["load_average_end"] = os.getloadavg()
  report["wall_seconds"] = round(time.time() - started)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(report, indent=2) + "\n")


def _seconds_text(result: dict) -> str:
  return (f"{result['seconds_per_step']:.4f} s/step" if "seconds_per_step" in result else
          result["error"])


def _summary(by_tree: dict) -> dict:
  """Each tree's median over repeats of a run's median seconds per step, their ratio, spread."""
  summary = {"baseline_seconds_per_step": None, "current_seconds_per_step": None,
             "ratio": None, "repeat_ratios": [], "runs": by_tree}
  medians = {tree: [r["seconds_per_step"] for r in results if "seconds_per_step" in r]
             for tree, results in by_tree.items()}
  if not all(medians.values()):
    return summary
  for tree, seconds in medians.items():
    summary[f"{tree}_seconds_per_step"] = statistics.median(seconds)
    for part in FIRST_STEP_PARTS:  # the pCTR runs' first step, median over repeats
      values = [r[part] for r in by_tree[tree] if r.get(part) is not None]
      if values:
        summary[f"{tree}_{part}"] = statistics.median(values)
  summary["ratio"] = summary["current_seconds_per_step"] / summary["baseline_seconds_per_step"]
  summary["repeat_ratios"] = [
      round(current["seconds_per_step"] / baseline["seconds_per_step"], 3)
      for baseline, current in zip(by_tree["baseline"], by_tree["current"])
      if "seconds_per_step" in baseline and "seconds_per_step" in current]
  # Paired within a repeat (the two runs were next to each other): steadier under changing load.
  summary["median_repeat_ratio"] = (statistics.median(summary["repeat_ratios"])
                                   if summary["repeat_ratios"] else None)
  return summary


def _revision(tree: pathlib.Path) -> str:
  return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                        text=True, check=True).stdout.strip()


@contextlib.contextmanager
def _baseline_tree(revision: str):
  """A detached worktree of ``revision`` in a temporary folder, removed afterwards."""
  folder = pathlib.Path(tempfile.mkdtemp(prefix="per_example_baseline_"))
  tree = folder / "tree"
  subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), revision],
                 check=True, capture_output=True)
  try:
    yield tree
  finally:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                   check=True, capture_output=True)
    folder.rmdir()


@contextlib.contextmanager
def _namespace_links(tree: pathlib.Path):
  """``sparse_dp/models -> ../models`` and ``sparse_dp/data -> ../data`` where missing."""
  made = []
  for name in _NAMESPACE_LINKS:
    link = tree / "sparse_dp" / name
    if not link.exists() and not link.is_symlink():
      link.symlink_to(pathlib.Path("..") / name)
      made.append(link)
  try:
    yield
  finally:
    for link in made:
      link.unlink()


def _in_subprocess(tree: pathlib.Path, kind: str, settings: dict, timeout: float) -> dict:
  """One measurement in a fresh Python whose ``sparse_dp`` is ``tree``'s."""
  worker = [str(pathlib.Path(__file__).resolve()), "--worker", kind, json.dumps(settings)]
  env = {**os.environ, "PYTHONPATH": str(tree), "TF_ENABLE_ONEDNN_OPTS": "0",
         "TF_CPP_MIN_LOG_LEVEL": "2"}
  start = time.perf_counter()
  try:
    done = subprocess.run([sys.executable] + worker, capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=tree)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout:g} s"}
  if done.returncode != 0:
    lines = done.stderr.strip().splitlines()
    return {"error": lines[-1] if lines else f"exit {done.returncode}"}
  result = json.loads(done.stdout.strip().splitlines()[-1])
  result["subprocess_seconds"] = round(time.perf_counter() - start, 1)
  return result


def _worker(kind: str, settings: dict) -> dict:
  """One measurement in this process: ``table4`` by the tree's ``step_time_benchmark.measure``."""
  import tensorflow as tf

  import sparse_dp
  # setup.py installs the tree's models/ and data/ as sparse_dp.models and sparse_dp.data
  # (package_dir); on PYTHONPATH only sparse_dp/ is the tree's, and an editable install
  # of another tree would supply those two. The tree itself, searched first, supplies them.
  sparse_dp.__path__.insert(1, str(pathlib.Path(sparse_dp.__file__).parents[1]))
  from sparse_dp.jobs.bench import step_time_benchmark
  from sparse_dp.models import pctr
  result = step_time_benchmark.measure(settings) if kind == "table4" else measure_pctr(settings)
  return {**result, "sparse_dp": sparse_dp.__file__, "models": pctr.__file__,
          "tensorflow": tf.__version__}


def measure_pctr(settings: dict) -> dict:
  """Seconds per step of the pCTR job's model under ``settings["algorithm"]`` (in this process),
  and the parts of its first step: ``make_private``, tracing the train function (its graph's
  nodes, functions' included), and the first run (graph optimisation or XLA compilation)."""
  import numpy as np

  import sparse_dp
  from sparse_dp import optimizers

  made_private = []
  make_private = sparse_dp.make_private

  def timed_make_private(*args, **kwargs):
    start = time.perf_counter()
    result = make_private(*args, **kwargs)
    made_private.append(time.perf_counter() - start)
    return result

  sparse_dp.make_private = timed_make_private
  try:
    model, config, iterator = pctr_training(settings["algorithm"],
                                            settings["warmup_steps"] + settings["steps"],
                                            jit_compile=settings.get("xla", False))
  finally:
    sparse_dp.make_private = make_private
  # As fit does (create_optimizer_weights): the slots exist before the first trace.
  optimizers.create_weights(model.optimizer, model.trainable_variables)
  train = model.make_train_function()
  start = time.perf_counter()
  graph = train.get_concrete_function(iterator).graph.as_graph_def()
  trace = time.perf_counter() - start
  seconds, first_run = [], None
  for step in range(settings["warmup_steps"] + settings["steps"]):
    start = time.perf_counter()
    logs = {k: np.asarray(v) for k, v in train(iterator).items()}
    if step == 0:
      first_run = time.perf_counter() - start  # graph optimisation or XLA compilation
    if step >= settings["warmup_steps"]:
      seconds.append(time.perf_counter() - start)
  return {"algorithm": settings["algorithm"], "xla": settings.get("xla", False),
          "make_private_seconds": made_private[0] if made_private else None,
          "trace_seconds": trace, "first_run_seconds": first_run,
          "first_step_seconds": trace + first_run,
          "graph_nodes": len(graph.node) + sum(len(f.node_def) for f in graph.library.function),
          "graph_functions": len(graph.library.function),
          "seconds_per_step": statistics.median(seconds),
          "step_seconds": seconds, "logs": sorted(logs), "config": {
              k: getattr(config, k) for k in ("algorithm", "noise_multiplier", "sigma1",
                                               "sigma2", "threshold", "threshold_sigmas")}}


def pctr_training(algorithm: str, batches: int, jit_compile: bool = False):
  """``(model, DPConfig, iterator)``: the pCTR job's model made private, and its batches.

  The model, optimizer and ``DPConfig`` of ``sparse-dp train`` with its defaults
  (``sparse_dp/jobs/train/fitting.py``), made private with ``sparse_dp.make_private``; the
  iterator repeats ``batches`` batches of random Zipf ids and log-normal integer
  features, whose first dimension is unknown to the traced step, as the job's
  Poisson batches. ``jit_compile``: the step compiled with XLA and, for a DP
  algorithm, fed each batch padded to its capacity with its example mask, as the
  job's ``poisson_dataset`` pads it (``sparse-dp train --jit-compile``).
  """
  import numpy as np
  import tensorflow as tf

  import sparse_dp
  from sparse_dp._keras import keras
  from sparse_dp.accounting import Algorithm
  from sparse_dp.data.criteo_format import NUM_INTEGER
  from sparse_dp.data.synthetic import SyntheticCriteo
  from sparse_dp.jobs.train import fitting
  from sparse_dp.jobs.train.job_flags import FitSettings
  from sparse_dp.models import pctr, pctr_data

  job = FitSettings()
  num_examples = int(400_000 * (1 - pctr_data.EVAL_SHARE))  # the job's default training split
  batch = job.batch_size
  sizes = pctr_data.hashed_vocabulary(SyntheticCriteo().scale).sizes
  keras.utils.set_random_seed(job.seed)
  model = pctr.build_pctr_model(sizes, pctr.HIDDEN_UNITS,
                                embedding_dims=[pctr.embedding_dim(v) for v in sizes])
  model.compile(optimizer=keras.optimizers.Adam(job.learning_rate),
                loss=keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=jit_compile)
  config = fitting._dp_config(Algorithm.parse(algorithm), job, num_examples, batch, sizes)
  sparse_dp.make_private(model, config, num_examples=num_examples, batch_size=batch,
                         epochs=job.epochs)
  rng = np.random.default_rng(0)
  examples = batches * batch
  ids = np.stack([rng.zipf(1.1, examples) % size for size in sizes], 1).astype("int64")
  integers = np.log1p(rng.lognormal(1.0, 1.5, (examples, NUM_INTEGER))).astype("float32")
  labels = rng.integers(0, 2, (examples, 1)).astype("float32")
  dataset = tf.data.Dataset.from_tensor_slices(
      ({"integers": integers, "categorical": ids}, labels)).batch(batch)
  if jit_compile and algorithm != "none":
    from sparse_dp.jobs.bench.step_time_benchmark import pad_rows
    from sparse_dp.training.poisson import padded_batches
    from sparse_dp.training.poisson.poisson_sampling import batch_capacity
    capacity = batch_capacity(num_examples, batch / num_examples)
    dataset = dataset.map(lambda x, y: padded_batches.padded(
        pad_rows((x, y), capacity - batch, tf), tf.range(capacity) < batch))
  return model, config, iter(dataset.repeat())


if __name__ == "__main__":
  if len(sys.argv) == 4 and sys.argv[1] == "--worker":
    print(json.dumps(_worker(sys.argv[2], json.loads(sys.argv[3]))))
  else:
    sys.exit(main())
