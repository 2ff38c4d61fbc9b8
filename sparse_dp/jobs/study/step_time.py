"""Step time by vocabulary size (Ghazi et al., NeurIPS 2023, Table 4), pCTR throughput by scale.

* The Table-4 model (one table, dim 64, batch 1024) through ``sparse-dp bench
  step`` (:mod:`sparse_dp.jobs.bench.step_time_benchmark`, each trainer in its own
  subprocess): median seconds per step, DP-SGD's over DP-AdaFEST's.
* The pCTR job at the Table-3 vocabulary sizes times each of the preset's
  scales, per algorithm and seed: examples per second as the job reports them,
  over ``model.fit``'s wall time (tracing included) and after its first step
  (:mod:`sparse_dp.jobs.train.step_clock`), with AUC, epsilon and
  gradient-size reduction, every run with the preset's ``--optimizer``. A point
  whose tables, optimizer state and (DP-SGD) dense noise cannot fit in this
  machine's memory (:mod:`sparse_dp.jobs.train.memory`) is listed under ``not_run``
  with the bound, instead of training.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Optional

from sparse_dp.jobs.study.presets import StudyPreset
from sparse_dp.jobs.study.runner.inputs import StudyInputs
from sparse_dp.jobs.study.runner.runs import MissingRun, Runner
from sparse_dp.jobs.study.sweeps import default_point
from sparse_dp.jobs.train import memory
from sparse_dp.models.pctr_data import hashed_vocabulary


def bench_steps(preset: StudyPreset) -> dict:
  """``sparse-dp bench step --json`` at the preset's vocabularies and trainers."""
  command = [sys.executable, "-m", "sparse_dp", "bench", "step", "--json",
             "--vocab", ",".join(map(str, preset.bench_vocabularies)),
             "--trainers", ",".join(preset.bench_trainers), "--steps", str(preset.bench_steps)]
  done = subprocess.run(command, capture_output=True, text=True, check=False)
  if done.returncode != 0:
    raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-2000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def table4(bench: dict) -> list[dict]:
  """Per vocabulary: seconds per step of each trainer, and DP-SGD's over DP-AdaFEST's."""
  rows = {}
  for result in bench["results"]:
    row = rows.setdefault(result["vocab"], {"vocab": result["vocab"]})
    row[result["trainer"]] = result.get("seconds_per_step")
  for row in rows.values():
    if row.get("dpsgd") and row.get("adafest"):
      row["reduction_factor"] = row["dpsgd"] / row["adafest"]
  return list(rows.values())


def throughput(preset: StudyPreset, data: str, out: pathlib.Path,
               memory_limit: Optional[int] = None,
               from_cache: bool = False) -> tuple[list[dict], list[dict], list[str]]:
  """The pCTR job's points at each of the preset's vocabulary scales, per scale the
  full-vocabulary points that cannot fit in ``memory_limit`` bytes (default: this
  machine's) with the preset's optimizer, grouped by the reason, and (``from_cache``:
  none trained) the labels of the points not all in the run cache."""
  limit = memory.memory_limit_bytes() if memory_limit is None else memory_limit
  points, not_run, missing = [], [], []
  for scale in preset.throughput_scales:
    sizes = hashed_vocabulary(scale).sizes
    sizes = sizes if preset.features is None else [sizes[f] for f in preset.features]
    wanted = [default_point(a, preset.epsilon, preset) for a in preset.throughput_algorithms]
    reasons = {p: memory.refusal(sizes, limit, p.algorithm, preset.optimizer)
               for p in wanted if p.fest_k is None}  # DP-FEST's tables hold its top-k rows
    refused = {p: reason for p, reason in reasons.items() if reason}
    for reason in dict.fromkeys(refused.values()):
      held = [p for p, r in refused.items() if r == reason]
      not_run.append({"vocabulary_scale": scale, "table_rows": sum(sizes), "reason": reason,
                      "algorithms": [p.label for p in held], "memory_limit_bytes": limit,
                      "bytes_needed": memory.bytes_needed(sizes, held[0].algorithm,
                                                          preset.optimizer)})
    trained = [p for p in wanted if p not in refused]
    if not trained:
      continue
    # Examples per second need no whole file: the throughput reads its own count.
    inputs = StudyInputs.load(data, preset.throughput_examples, scale, preset.features,
                              pathlib.Path(out) / "data", hash_scale=scale,
                              max_examples=preset.throughput_examples)
    runs = Runner(inputs, preset, out, from_cache=from_cache)
    for point in trained:
      try:
        points.append(runs.summary(point, vocabulary_scale=scale, table_rows=inputs.rows))
      except MissingRun:
        missing.append(f"{point.label} at x{scale:g}")
  return points, not_run, missing


def step_time(preset: StudyPreset, data: str, out: pathlib.Path,
              from_cache: bool = False) -> dict:
  """Table 4 (measured anew: ``sparse-dp bench step`` trains no model) and the pCTR
  throughput points (``from_cache``: the cached ones, the others under ``missing``)."""
  bench = bench_steps(preset)
  points, not_run, missing = throughput(preset, data, out, from_cache=from_cache)
  return {"study": "step-time", "preset": preset.describe(), "data": data,
          "epsilon": preset.epsilon, "bench": bench, "table4": table4(bench), "points": points,
          "not_run": not_run, "missing": missing}
