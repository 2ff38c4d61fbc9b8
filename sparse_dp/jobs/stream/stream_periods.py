"""One period of ``sparse-dp stream``: its spends, its training, its published model.

The order is what makes a crash harmless (see :mod:`sparse_dp.jobs.stream.stream_job`):
ledger entry, then the mechanism, then one rename that publishes the period.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import pathlib
import re
import shutil

import numpy as np
import pandas as pd

from sparse_dp.accounting import Algorithm
from sparse_dp.data import synthetic_cache
from sparse_dp.data.criteo import CriteoReader
from sparse_dp.data.synthetic import SyntheticCriteo
from sparse_dp.data.vocabulary import OOV_ID, Vocabulary
from sparse_dp.jobs.stream.stream_state import MODEL_FOLDER, WEIGHTS_FILE
from sparse_dp.jobs.train import fitting, job_flags
from sparse_dp.mechanisms.rows.remapping import BucketRemapping
from sparse_dp.mechanisms.selection.preselection import Preselection, preselect_buckets
from sparse_dp.models import pctr, pctr_data
from sparse_dp.training.dp_state.provenance import rebound_record

_DAY_NUMBER = re.compile(r"day_(\d+)")


def stream_vocabulary(args) -> Vocabulary:
  """The stream's tables: the first ``--categorical-features`` of Table 3, hashed at
  ``--synthetic-scale`` for synthetic days and at scale 1 for Criteo-1TB files."""
  scale = args.synthetic_scale if args.data == "synthetic" else 1.0
  return pctr_data.hashed_vocabulary(scale).leading(args.categorical_features)


class StreamData:
  """The stream's days: synthetic ones written into the state, or Criteo-1TB files."""

  def __init__(self, args, state_folder: pathlib.Path):
    self.args = args
    self.synthetic, self.files = None, {}
    if args.data == "synthetic":
      self.synthetic = SyntheticCriteo(scale=args.synthetic_scale, seed=args.seed,
                                       light_users=args.light_users)
    else:
      for path in sorted(pathlib.Path(p) for p in glob.glob(args.data)):
        match = _DAY_NUMBER.search(path.name)
        if match:
          self.files[int(match.group(1))] = path
      if not self.files:
        raise ValueError(f"--data {args.data!r} matches no day_N file")
    self.folder = state_folder / "data"
    self.vocabulary = stream_vocabulary(args)
    self.skipped_lines = 0
    self._counts: dict[int, list] = {}  # per day: distinct examples per bucket of each table

  def check_days(self, days: list[int]) -> None:
    if self.synthetic is not None:
      bad = [d for d in days if not 0 <= d < self.synthetic.num_days]
      where = f"the synthetic data's days 0..{self.synthetic.num_days - 1}"
    else:
      bad = [d for d in days if d not in self.files]
      where = f"the files of --data (days {sorted(self.files)})"
    if bad:
      raise ValueError(f"days {bad} are not among {where}")

  def _path(self, day: int) -> pathlib.Path:
    if self.synthetic is None:
      return self.files[day]
    path = self.folder / f"day_{day}.gz"
    if not path.exists():  # written whole, then renamed: a crash leaves no half day
      self.folder.mkdir(parents=True, exist_ok=True)
      synthetic_cache.write_day(self.synthetic, path, day, self.args.examples_per_day)
    return path

  def frame(self, days: list[int], per_day: int) -> pd.DataFrame:
    frames = []
    for day in days:
      reader = CriteoReader([self._path(day)], on_bad_line=self.args.on_bad_line)
      frames.append(reader.read_all(per_day))
      self.skipped_lines += reader.skipped_lines
    return pd.concat(frames, ignore_index=True)

  def table_counts(self, days: list[int]) -> list:
    """Bucket counts of ``days`` summed; each day is read and counted once per process
    (a running sum would otherwise re-read every earlier day each period)."""
    for day in days:
      if day not in self._counts:
        ids = self.inputs([day], self.args.examples_per_day)[0]["categorical"]
        self._counts[day] = fitting.table_counts(ids, self.vocabulary.sizes)
    return [sum(tables) for tables in zip(*(self._counts[day] for day in days))]

  def inputs(self, days: list[int], per_day: int):
    return pctr_data.model_inputs(self.frame(days, per_day), self.vocabulary)


def run_period(state, job: dict, plan: dict, data: StreamData, held_out, args,
               first_day: int) -> None:
  """Runs one planned period unless it is published already."""
  period = plan["period"]
  folder = state.period_folder(period)
  if (folder / "metrics.json").exists():
    return
  kind = Algorithm.parse(args.algorithm)
  ledger, sizes = state.ledger, data.vocabulary.sizes
  seed = int(np.random.SeedSequence([state.seed, period]).generate_state(1, np.uint64)[0]) >> 2
  train = data.inputs(plan["days"], args.examples_per_day)
  job_flags.check_batch_fits(args.batch_size, len(train[1]))  # before any spend is recorded
  preselection = None
  if plan["selection_epsilon"] > 0:
    counted = _counted_days(job, plan, args.fest_frequencies, first_day)
    if ledger.find(period, "selection") is None:
      ledger.record(period, "selection", plan["selection_epsilon"], 0.0, days=counted,
                    k=args.fest_k)
    preselection = preselect_buckets(data.table_counts(counted), args.fest_k,
                                     plan["selection_epsilon"], [seed, 1])
  elif kind.uses_top_k_selection:
    preselection = _load_preselection(state.period_folder(period - 1), sizes)
  if ledger.find(period, "training") is None:
    ledger.record(period, "training", plan["training_epsilon"], plan["delta"],
                  days=plan["days"], algorithm=kind.value)
  settings = job_flags.fit_settings(args, epsilon=plan["training_epsilon"], delta=plan["delta"])
  # Earlier periods' records (training and any preselection charged in them)
  # come with the warm-started weights; a new preselection is charged in this one.
  earlier = sum(e["epsilon"] for e in ledger.entries if e["period"] < period)
  settings = dataclasses.replace(settings, noise_seed=seed, earlier_epsilon=earlier,
                                 selection_epsilon=plan["selection_epsilon"])
  previous = state.period_folder(period - 1)
  warm_start = (_warm_start(previous, _load_preselection(previous, sizes), preselection)
                if (previous / WEIGHTS_FILE).exists() else None)
  fit = fitting.fit_and_evaluate(kind.value, settings, train, held_out, sizes,
                                 preselection=preselection, initial_weights=warm_start)
  this_period = sum(e["epsilon"] for e in ledger.entries if e["period"] == period)
  metrics = {"period": period, "days": plan["days"], **fit.metrics,
             "epsilon": this_period, "epsilon_spent": earlier + this_period,
             "skipped_lines": data.skipped_lines}
  _publish(folder, fit.model, preselection, metrics)


def _counted_days(job: dict, plan: dict, frequencies: str, first_day: int) -> list[int]:
  if frequencies == "first-day":
    return [first_day]
  if frequencies == "all-days":
    return [day for p in job["periods"] for day in p["days"]]
  return [day for p in job["periods"] if p["period"] <= plan["period"] for day in p["days"]]


def _publish(folder: pathlib.Path, model, preselection, metrics: dict) -> None:
  """Writes the period into a scratch folder and renames it into place."""
  scratch = folder.with_name(f".{folder.name}.partial")
  if scratch.exists():
    shutil.rmtree(scratch)
  scratch.mkdir(parents=True)
  pctr.save_model(model, scratch / MODEL_FOLDER)
  np.savez(scratch / WEIGHTS_FILE, **{f"{layer.name}/{i}": w.numpy()
                                      for layer in model.layers
                                      for i, w in enumerate(layer.weights)})
  if preselection is not None:
    (scratch / "preselection.json").write_text(json.dumps(
        {"epsilon": preselection.epsilon, "kept_buckets": preselection.kept_buckets}))
  (scratch / "metrics.json").write_text(json.dumps(metrics, indent=2))
  scratch.rename(folder)


def _load_preselection(folder: pathlib.Path, sizes) -> Preselection | None:
  path = folder / "preselection.json"
  if not path.exists():
    return None
  record = json.loads(path.read_text())
  remappings = tuple(None if kept is None else BucketRemapping(kept)
                     for kept in record["kept_buckets"])
  return Preselection(remappings, tuple(size if r is None else r.vocabulary_size
                                        for size, r in zip(sizes, remappings)),
                      record["epsilon"])


def _warm_start(previous: pathlib.Path, old: Preselection | None, new: Preselection | None):
  """Loads the previous period's weights, carrying table rows across selections."""
  def load(model) -> None:
    saved = np.load(previous / WEIGHTS_FILE)
    for layer in model.layers:
      values = [saved[f"{layer.name}/{i}"] for i in range(len(layer.weights))]
      carried = list(values)
      for i, variable in enumerate(layer.weights):
        if variable is getattr(layer, "embeddings", None) and new is not None:
          table = int(layer.name.split("_")[1])
          carried[i] = _carry_rows(values[i], old.kept_buckets[table] if old else None,
                                   new.kept_buckets[table])
      for i, variable in enumerate(layer.weights):
        trained = [j for j, v in enumerate(layer.weights) if v.trainable]
        if (variable is getattr(layer, "dp_record", None)
            and any(carried[j] is not values[j] for j in trained)):  # bound to carried rows
          carried[i] = rebound_record(values[i], layer.name, [values[j] for j in trained],
                                      [carried[j] for j in trained])
        variable.assign(carried[i])
  return load


def _carry_rows(table: np.ndarray, old_kept, new_kept) -> np.ndarray:
  """Rows of ``new_kept`` buckets taken from ``table`` (kept by ``old_kept``; OOV last)."""
  if old_kept == new_kept:
    return table
  if new_kept is None:
    raise ValueError("the previous period preselected this table and this one does not; "
                     "a stream cannot switch to full tables: start a new --state")
  if old_kept is None:  # the full table: a bucket's row is its id
    return table[list(new_kept) + [OOV_ID]]
  position = {bucket: row for row, bucket in enumerate(old_kept)}
  oov = len(old_kept)
  return table[[position.get(bucket, oov) for bucket in new_kept] + [oov]]
