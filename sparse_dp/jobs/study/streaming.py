"""Streaming periods and DP-FEST's frequency sources (Ghazi et al., NeurIPS 2023, §4.3, Fig. 5).

Each stream is ``sparse-dp stream`` itself (:mod:`sparse_dp.jobs.stream.stream_job`)
in its own state folder: retrained period by period under one budget, every
period warm-started from the previous one and evaluated on the evaluation days.
DP-AdaFEST adapts per batch; DP-FEST's top-k counts buckets of the first
training day (``first-day``), all training days (``all-days``) or the days up
to each period (``running``). A point is a stream repeated over the preset's
seeds (``--seed``: the synthetic days and the initial weights), trained with the
preset's ``--optimizer`` and ``--learning-rate``; its AUC is the
last period's, its reduction the mean over periods. A preset with several
``stream_periods`` (days per period, Fig. 5's T) runs every stream at each. Each
stream's summary is cached in its folder, so a study resumes where it stopped and
``from_cache`` draws the finished ones.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import pathlib
import statistics
from typing import Any, Optional

from sparse_dp.jobs.stream.stream_job import parse_days
from sparse_dp.jobs.stream.stream_lock import StateLock
from sparse_dp.jobs.stream.stream_state import StreamState
from sparse_dp.jobs.study.presets import StudyPreset
from sparse_dp.jobs.study.runner.runs import at_first_value, spread


def _stream_flags(preset: StudyPreset, data: str, algorithm: str, source: str, seed: int,
                  state: pathlib.Path, period: int) -> dict[str, Any]:
  return {"--data": data, "--train-days": preset.stream_train_days,
          "--eval-days": preset.stream_eval_days,
          "--streaming-period": period, "--algorithm": algorithm,
          "--total-epsilon": preset.epsilon, "--fest-frequencies": source,
          "--examples-per-day": preset.stream_examples_per_day,
          "--eval-examples-per-day": preset.stream_eval_examples_per_day,
          "--synthetic-scale": preset.synthetic_scale, "--batch-size": preset.batch_size,
          "--epochs": preset.epochs, "--learning-rate": preset.learning_rate,
          "--optimizer": preset.optimizer,
          "--l2-norm-clip": preset.l2_norm_clip,
          "--hidden-units": ",".join(map(str, preset.hidden_units)),
          "--fest-k": preset.fest_ks[0], "--selection-share": preset.selection_share,
          "--tau-sigmas": preset.tau_sigmas[0],
          "--sigma-ratio": preset.sigma_ratios[0], "--seed": seed, "--state": state,
          **({"--categorical-features": preset.stream_features}
             if preset.stream_features is not None else {})}


def _argv(flags: dict[str, Any]) -> list[str]:
  return [str(part) for item in flags.items() for part in item]


def stream_folder(preset: StudyPreset, data: str, algorithm: str, source: str, seed: int,
                  period: int) -> str:
  """The name of one stream's folder under ``OUT/streams``: a hash of its flags, a
  setting added since the first streams left out at the value they trained with (as in
  a run's key, :func:`sparse_dp.jobs.study.runner.runs.at_first_value`), so their folders
  stay valid."""
  flags = _stream_flags(preset, data, algorithm, source, seed, pathlib.Path("."), period)
  key = _argv({flag: value for flag, value in flags.items()
               if not at_first_value(flag[2:].replace("-", "_"), value)})
  return f"{algorithm}-{source}-seed{seed}-" + hashlib.sha256(
      json.dumps(key).encode()).hexdigest()[:10]


def run_stream(preset: StudyPreset, data: str, algorithm: str, source: str, seed: int,
               out: pathlib.Path, period: int, from_cache: bool = False) -> Optional[dict]:
  """``sparse-dp stream``'s summary for one stream of ``period`` days per period
  (reused when its folder has one; None where it has none and ``from_cache``)."""
  from sparse_dp.jobs.stream import stream_job
  state = (pathlib.Path(out) / "streams"
           / stream_folder(preset, data, algorithm, source, seed, period))
  done = state / "study_summary.json"
  if done.exists():
    return json.loads(done.read_text())
  if from_cache:
    return None
  commands = argparse.ArgumentParser().add_subparsers()
  stream_job.add_parser(commands)
  args = commands.choices["stream"].parse_args(
      _argv(_stream_flags(preset, data, algorithm, source, seed, state, period)))
  state.mkdir(parents=True, exist_ok=True)
  with open(state / "study.log", "a") as log, contextlib.redirect_stdout(log):
    summary = stream_job.stream(args)  # resumes a stream an earlier study left unfinished
  done.write_text(json.dumps(summary, indent=1))
  # The study reads the summary; 132 periods a seed of SavedModels would not fit a disk.
  with StateLock(state):
    StreamState.open(state, None, 0.0).drop_earlier_models()
  return summary


def streaming(preset: StudyPreset, data: str, out: pathlib.Path,
              from_cache: bool = False) -> dict:
  """Every stream at every period length, seed by seed (so that an interrupted study
  has whole seeds to show), the longest periods (the fewest of them) first, so that a
  seed cut short has the most lengths. A period length's points pair the seeds all its
  streams have finished; the others are listed under ``missing`` (``from_cache``: train
  none)."""
  lengths = preset.stream_periods or (preset.stream_period,)
  finished = {}
  for seed in preset.seeds:
    for period in sorted(lengths, reverse=True):
      for algorithm, source in preset.streams:
        summary = run_stream(preset, data, algorithm, source, seed, out, period, from_cache)
        if summary is not None:
          finished[period, algorithm, source, seed] = summary["periods"]
  points, missing = [], []
  for period in lengths:
    seeds = [seed for seed in preset.seeds
             if all((period, a, s, seed) in finished for a, s in preset.streams)]
    suffix = f" T={period}" if len(lengths) > 1 else ""
    if len(seeds) < len(preset.seeds):
      count = len(preset.streams)
      missing.append(f"{count} stream{'s' * (count != 1)}{suffix} of seeds "
                     + ",".join(str(s) for s in preset.seeds if s not in seeds))
    for algorithm, source in preset.streams if seeds else ():
      point = _point(algorithm, source if algorithm == "fest" else None,
                     [finished[period, algorithm, source, seed] for seed in seeds], seeds,
                     preset.epsilon)
      if len(lengths) > 1:
        point.update(streaming_period=period, label=point["label"] + suffix)
      points.append(point)
  source = {"train_examples": len(parse_days(preset.stream_train_days, "train days"))
            * preset.stream_examples_per_day,
            "held_out_examples": len(parse_days(preset.stream_eval_days, "eval days"))
            * preset.stream_eval_examples_per_day}
  return {"study": "streaming", "preset": preset.describe(), "data": data, "source": source,
          "epsilon": preset.epsilon, "train_days": preset.stream_train_days,
          "eval_days": preset.stream_eval_days, "streaming_period": preset.stream_period,
          **({"streaming_periods": list(lengths)} if len(lengths) > 1 else {}),
          "points": points, "missing": missing}


def _point(algorithm: str, source, runs: list[list[dict]], seeds: list[int],
           epsilon: float) -> dict:
  """A stream over seeds: per period and the last period's AUC, mean reduction."""
  periods = []
  for period in zip(*runs):
    aucs = [p["auc"] for p in period]
    periods.append({"period": period[0]["period"], "days": period[0]["days"],
                    "auc": aucs, "auc_mean": statistics.fmean(aucs), "auc_std": spread(aucs),
                    "epsilon_spent": max(p["epsilon_spent"] for p in period),
                    "gradient_size_reduction": statistics.fmean(
                        p["gradient_size_reduction"] for p in period)})
  reductions = [statistics.fmean(p["gradient_size_reduction"] for p in run) for run in runs]
  last = periods[-1]
  return {"algorithm": algorithm, "fest_frequencies": source, "epsilon": epsilon,
          "label": algorithm if source is None else f"{algorithm} ({source})",
          "seeds": seeds, "auc": last["auc"], "auc_mean": last["auc_mean"],
          "auc_std": last["auc_std"], "epsilon_spent": last["epsilon_spent"],
          "gradient_size_reduction": statistics.fmean(reductions),
          "gradient_size_reduction_std": spread(reductions), "periods": periods}
