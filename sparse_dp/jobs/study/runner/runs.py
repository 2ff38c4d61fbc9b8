"""One point of a sweep, trained over the preset's seeds, each run cached on disk.

A run is one configuration of ``sparse-dp train``
(:func:`sparse_dp.jobs.train.fitting.train_and_evaluate`, the command's own entry point), with
the command's flags parsed by the command's parser, so a point's numbers are those the command
prints for the same flags. Each run's metrics are written to ``<folder>/runs/<key>.json``
(whole, then renamed), keyed by a hash of the data's description, the point, the parsed
settings and the preset's ``version``, so studies that share points train them once, a killed
study resumes, and ``from_cache`` trains nothing. Seeds vary the initial weights and the DP
noise; the data stay fixed unless the preset resamples them per seed (``resample_data``), so
two points' AUCs are compared seed by seed (:func:`paired_difference`). See
docs/commands/study.md ("How runs are cached and seeded").
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import pathlib
import statistics
from typing import Any, Callable, Optional, Sequence

from sparse_dp.accounting import Algorithm
from sparse_dp.accounting.adafest_defaults import RULE
from sparse_dp.jobs.study.presets import StudyPreset
from sparse_dp.jobs.study.runner.inputs import StudyInputs
from sparse_dp.jobs.study.runner.train_arguments import train_arguments
from sparse_dp.jobs.train import job_flags

# Settings added to FitSettings after the first cached runs, at the values those runs
# trained with: left out of a run's key at these values, so the cache stays valid.
_SETTINGS_ADDED = {"optimizer": "adam", "embedding_dim": None, "dense_tables": ()}


def at_first_value(name: str, value) -> bool:
  """Whether ``name`` is a setting of :data:`_SETTINGS_ADDED` at the value the first
  cached runs trained with (left out of a cache key, so those keys stay valid)."""
  return name in _SETTINGS_ADDED and _SETTINGS_ADDED[name] == value


def _settings_key(settings: job_flags.FitSettings) -> dict:
  """The run's settings as its cache key holds them (:data:`_SETTINGS_ADDED` at their
  first value left out). A setting whose default became a rule (``None``) after the first
  cached runs is keyed at the default those runs trained with
  (``job_flags.DEFAULTS_BEFORE_RULE``), so runs that do not read it keep their keys; a
  point that leaves it to the rule has it ``None`` in its ``Point``, so its key differs."""
  before = job_flags.DEFAULTS_BEFORE_RULE
  return {name: before[name] if value is None and name in before else value
          for name, value in dataclasses.asdict(settings).items()
          if not at_first_value(name, value)}


def uses_adafest_rule(settings: job_flags.FitSettings, algorithm: str) -> bool:
  """Whether a run of ``algorithm`` takes its threshold or noise ratio from the rule of
  :mod:`sparse_dp.accounting.adafest_defaults` (its key then holds the rule's constants)."""
  return Algorithm.parse(algorithm).uses_contribution_map and (
      settings.sigma_ratio is None or (settings.tau_sigmas is None and settings.tau is None))


@dataclasses.dataclass(frozen=True)
class Point:
  """One configuration: ``fest_k`` for DP-FEST / DP-AdaFEST+, ``tau_sigmas`` and
  ``sigma_ratio`` (sigma1 / sigma2) for DP-AdaFEST / DP-AdaFEST+; ``flags``, other
  ``sparse-dp train`` flags as ``(name, value)`` pairs (a grid's,
  :mod:`sparse_dp.jobs.study.runner.grid`), over the preset's."""

  algorithm: str
  epsilon: Optional[float]
  fest_k: Optional[int] = None
  tau_sigmas: Optional[float] = None
  sigma_ratio: Optional[float] = None
  flags: tuple[tuple[str, Any], ...] = ()

  @property
  def label(self) -> str:
    parts = [self.algorithm]
    if self.fest_k is not None:
      parts.append(f"k={self.fest_k}")
    if self.tau_sigmas is not None:
      parts.append(f"tau={self.tau_sigmas:g}s")
    if self.sigma_ratio is not None:
      parts.append(f"s1/s2={self.sigma_ratio:g}")
    parts += [f"{name}={value}" for name, value in self.flags]
    return " ".join(parts)


class MissingRun(LookupError):
  """A run a ``from_cache`` runner does not find in its cache."""


class Runner:
  """Trains points of one :class:`StudyInputs` with one preset's model and schedule.

  ``inputs_for_seed(seed)``, where given, gives each seed its own inputs (``inputs``
  is then the first seed's, which describes the study); ``from_cache``: a run not in
  the cache raises :class:`MissingRun` instead of training."""

  def __init__(self, inputs: StudyInputs, preset: StudyPreset, folder: pathlib.Path,
               inputs_for_seed: Optional[Callable[[int], StudyInputs]] = None,
               from_cache: bool = False):
    self.inputs, self.preset, self.from_cache = inputs, preset, from_cache
    self._inputs_for_seed = inputs_for_seed or (lambda seed: inputs)
    self.folder = pathlib.Path(folder) / "runs"
    self.folder.mkdir(parents=True, exist_ok=True)
    # Each run's metrics once read or trained: a summary over seeds then loads no seed's
    # data again (a seed's synthetic draw takes seconds to read).
    self._metrics: dict[tuple[Point, int], dict] = {}

  def arguments(self, point: Point, seed: int) -> argparse.Namespace:
    """``sparse-dp train``'s arguments of ``point`` at ``seed``: the preset's model,
    optimizer and schedule, then the point's flags."""
    p = self.preset
    flags = {"algorithm": point.algorithm, "epsilon": point.epsilon or 1.0,
             "epochs": p.epochs, "batch_size": p.batch_size, "learning_rate": p.learning_rate,
             "optimizer": p.optimizer,
             "l2_norm_clip": p.l2_norm_clip, "hidden_units": ",".join(map(str, p.hidden_units)),
             "selection_share": p.selection_share, "seed": seed,
             "noise_seed": 7919 * (seed + 1), "fest_k": point.fest_k,
             "tau_sigmas": point.tau_sigmas, "sigma_ratio": point.sigma_ratio,
             **dict(point.flags)}
    return train_arguments({k: v for k, v in flags.items() if v is not None})

  def run(self, point: Point, seed: int) -> dict:
    """The job's metrics for ``point`` at ``seed`` (from the cache when there)."""
    if (point, seed) not in self._metrics:
      self._metrics[point, seed] = self._read_or_train(point, seed)
    return self._metrics[point, seed]

  def _read_or_train(self, point: Point, seed: int) -> dict:
    args = self.arguments(point, seed)
    settings = job_flags.fit_settings(args, epsilon=args.epsilon)
    inputs = self._inputs_for_seed(seed)
    key = {"source": inputs.source, "point": dataclasses.asdict(point),
           "settings": _settings_key(settings), "fest_k": args.fest_k,
           "selection_share": args.selection_share}
    if self.preset.version != 1:
      key["preset_version"] = self.preset.version
    if uses_adafest_rule(settings, point.algorithm):
      key["adafest_rule"] = list(RULE)
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = self.folder / f"{name}.json"
    if path.exists():
      return json.loads(path.read_text())["metrics"]
    if self.from_cache:
      raise MissingRun(f"{point.label} seed {seed}: no {path}")
    from sparse_dp.jobs.train import fitting
    with open(self.folder / f"{name}.log", "w") as log, contextlib.redirect_stdout(log):
      fit, preselection = fitting.train_and_evaluate(
          point.algorithm, settings, inputs.train, inputs.held_out,
          list(inputs.vocabulary_sizes), fest_k=args.fest_k,
          selection_share=args.selection_share)
    metrics = dict(fit.metrics)
    if inputs.test is not None:
      metrics["test_auc"] = fitting.held_out_auc(fit.model, inputs.test, preselection)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({**key, "metrics": metrics}, indent=1))
    partial.rename(path)
    return metrics

  def summary(self, point: Point, **extra) -> dict:
    """``point`` over the preset's seeds: AUC mean and spread (``auc``: the held-out, or
    validation, split's; ``test_auc``: the test split's, where the inputs have one),
    epsilon, reduction."""
    runs = [self.run(point, seed) for seed in self.preset.seeds]
    aucs = [r["auc"] for r in runs]
    if all("test_auc" in r for r in runs):
      tests = [r["test_auc"] for r in runs]
      extra = {"test_auc": tests, "test_auc_mean": statistics.fmean(tests),
               "test_auc_std": spread(tests), **extra}
    reductions = [r["gradient_size_reduction"] for r in runs]
    epsilons = [r["epsilon"] for r in runs if r["epsilon"] is not None]
    return {**dataclasses.asdict(point), **extra, "label": point.label,
            "seeds": list(self.preset.seeds), "auc": aucs,
            "auc_mean": statistics.fmean(aucs), "auc_std": spread(aucs),
            "epsilon_spent": max(epsilons) if epsilons else None,
            "gradient_size_reduction": statistics.fmean(reductions),
            "gradient_size_reduction_std": spread(reductions),
            "examples_per_second": statistics.fmean(r["examples_per_second"] for r in runs),
            **_steady_rate(runs),
            "noise_multipliers": runs[0]["noise_multipliers"]}


def _steady_rate(runs: list[dict]) -> dict:
  """Mean first-step seconds and examples per second after it, over the seeds
  (:mod:`sparse_dp.jobs.train.step_clock`); ``None`` unless every seed's run has them
  (runs cached before they were measured, loops without Keras callbacks)."""
  keys = ("first_step_seconds", "examples_per_second_after_first_step")
  return {key: (statistics.fmean(r[key] for r in runs)
                if all(r.get(key) is not None for r in runs) else None) for key in keys}


def spread(values) -> float:
  """Sample standard deviation over seeds (0 for one seed)."""
  return statistics.stdev(values) if len(values) > 1 else 0.0


def paired_difference(values: Sequence[float], baseline: Sequence[float]) -> dict:
  """Mean of ``values[i] - baseline[i]`` over seeds (same seed: same data, same
  initial weights) with its 95% Student-t interval, ``mean ± t_{0.975, n-1} sd /
  sqrt(n)`` (``None`` for one seed)."""
  from scipy import stats
  if len(values) != len(baseline):
    raise ValueError(f"paired over seeds: {len(values)} values, {len(baseline)} baselines")
  differences = [v - b for v, b in zip(values, baseline)]
  mean, n = statistics.fmean(differences), len(differences)
  half = (stats.t.ppf(0.975, n - 1) * statistics.stdev(differences) / n ** 0.5
          if n > 1 else None)
  return {"mean": mean, "low": None if half is None else mean - half,
          "high": None if half is None else mean + half, "n": n}
