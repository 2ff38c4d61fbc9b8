"""Run a study by name and publish its report: ``<out>/<name>.json``, ``.md`` and ``.png``."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Optional

from sparse_dp.jobs.study.presets import StudyPreset
from sparse_dp.jobs.study.presets import preset as named_preset
from sparse_dp.jobs.study.reports import plots, tables
from sparse_dp.jobs.study.reports.claims import claims
from sparse_dp.jobs.study.runner.grid import Grid
from sparse_dp.jobs.study.runner.inputs import SYNTHETIC
from sparse_dp.jobs.study.runner.train_arguments import train_arguments
from sparse_dp.jobs.study.step_time import step_time
from sparse_dp.jobs.study.streaming import streaming
from sparse_dp.jobs.study.sweeps import epsilon_sweep, heatmap, tradeoffs

STUDIES = {"tradeoffs": tradeoffs, "epsilon": epsilon_sweep, "heatmap": heatmap,
           "streaming": streaming, "step-time": step_time}
# Studies whose report is a function of cached runs alone (``--from-cache``).
CACHED_STUDIES = ("tradeoffs", "epsilon", "heatmap", "streaming", "step-time")
# Studies whose points a grid file gives (``--grid``, :mod:`sparse_dp.jobs.study.runner.grid`).
GRID_STUDIES = ("tradeoffs", "epsilon", "heatmap")


def output_paths(study: str, out) -> dict[str, pathlib.Path]:
  stem = pathlib.Path(out) / study.replace("-", "_")
  return {suffix: stem.with_suffix(f".{suffix}") for suffix in ("json", "md", "png")}


def trained_with(preset: StudyPreset, optimizer: Optional[str] = None,
                 learning_rate: Optional[float] = None) -> StudyPreset:
  """``preset`` with every run's ``--optimizer`` and ``--learning-rate`` where given (an
  optimizer alone keeps the preset's learning rate); a value ``sparse-dp train`` refuses
  is refused here, naming the flag, before anything trains."""
  changes = {name: value for name, value in (("optimizer", optimizer),
                                             ("learning_rate", learning_rate))
             if value is not None}
  train_arguments(changes)
  return dataclasses.replace(preset, **changes)


def run_study(study: str, preset: str = "smoke", data: str = "synthetic",
              out="study-results", grid=None, from_cache: bool = False,
              optimizer: Optional[str] = None, learning_rate: Optional[float] = None) -> dict:
  """Runs ``study`` at ``preset`` on ``data`` (trained runs cached under ``out/runs``),
  writes its JSON, markdown table and figure under ``out``, and returns the report.
  ``grid`` (a grid file's path; :data:`GRID_STUDIES`) gives the points instead of the
  preset's sweep (:mod:`sparse_dp.jobs.study.runner.grid`). ``from_cache``: train nothing, report
  the runs in ``out/runs`` (the points not all there listed under ``missing``).
  ``optimizer`` and ``learning_rate``: every run's, in place of the preset's
  (:func:`trained_with`)."""
  if study not in STUDIES:
    raise ValueError(f"unknown study {study!r}; choose from {', '.join(STUDIES)}")
  if from_cache and study not in CACHED_STUDIES:
    raise ValueError(f"--from-cache: the {study} study is not drawn from the run cache; "
                     f"give it to {', '.join(CACHED_STUDIES)}")
  sizes = trained_with(named_preset(preset), optimizer, learning_rate)
  options = {"from_cache": True} if from_cache else {}
  if grid is not None:
    if study not in GRID_STUDIES:
      raise ValueError(f"--grid: the {study} study runs its preset's streams or scales; a grid "
                       f"gives the points of {', '.join(GRID_STUDIES)} "
                       f"(`sparse-dp study tradeoffs --grid FILE`)")
    read = Grid.read(grid)
    if read.examples is not None and data != SYNTHETIC:
      raise ValueError(f"--grid {str(grid)!r}: examples sets how many synthetic examples are "
                       f"drawn; --data {data!r} is read, not drawn: cap its lines with "
                       f"max_examples")
    sizes, options["points"] = read.preset(sizes), list(read.points)
  out = pathlib.Path(out)
  out.mkdir(parents=True, exist_ok=True)
  report = STUDIES[study](sizes, data, out, **options)
  if grid is not None:
    report["grid"] = str(grid)
  publish(report, out)
  return report


def publish(report: dict, out) -> dict[str, pathlib.Path]:
  """Writes the report's JSON, then the table and the figure drawn from that JSON."""
  paths = output_paths(report["study"], out)
  paths["json"].write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
  written = json.loads(paths["json"].read_text())
  paths["md"].write_text(tables.markdown(written))
  plots.save(written, paths["json"], paths["png"])
  return paths


def show(study: str, preset: str = "smoke", data: str = "synthetic",
         out="study-results", optimizer: Optional[str] = None,
         learning_rate: Optional[float] = None, from_cache: bool = False) -> dict:
  """:func:`run_study`, then displays its table and figure (in a notebook)."""
  from IPython.display import Image, Markdown, display
  report = run_study(study, preset, data, out, optimizer=optimizer,
                     learning_rate=learning_rate, from_cache=from_cache)
  display(Markdown(tables.markdown(report)))
  display(Image(filename=str(output_paths(study, out)["png"])))
  return report


def show_claims(*reports: dict) -> list[str]:
  """Displays (in a notebook) and returns whether the paper's claims hold in ``reports``,
  one line per claim with its numbers (:func:`sparse_dp.jobs.study.reports.claims.claims`),
  opened by the study that measured it."""
  from IPython.display import Markdown, display
  lines = [f"{report['study']}: {line}" for report in reports for line in claims(report)]
  display(Markdown("\n".join(f"- {line}" for line in lines)))
  return lines
