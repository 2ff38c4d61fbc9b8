"""The committed study results are what their JSON, run caches and stream summaries say."""

import json
import pathlib

import pytest

from sparse_dp.jobs.study.presets import FULL, PAPER
from sparse_dp.jobs.study.reports import tables
from sparse_dp.jobs.study.runner.grid import Grid
from sparse_dp.jobs.study.runner.inputs import StudyInputs
from sparse_dp.jobs.study.streaming import streaming
from sparse_dp.jobs.study.studies import output_paths

from support.study_checks import assert_figure_matches_report

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "study"


# The committed reports: the trade-off studies at the paper preset (with their run cache),
# streaming and step time at the full preset.
COMMITTED = {"tradeoffs": "paper", "epsilon": "paper", "heatmap": "paper",
             "streaming": "full", "step-time": "full"}


def committed_folder(preset: str) -> pathlib.Path:
  return RESULTS / "paper" if preset == "paper" else RESULTS


@pytest.mark.parametrize("study, preset", list(COMMITTED.items()))
def test_committed_figures_match_their_json(study, preset):
  paths = output_paths(study, committed_folder(preset))
  report = json.loads(paths["json"].read_text())
  assert report["preset"]["name"] == preset
  assert_figure_matches_report(paths["json"], paths["png"])
  assert paths["md"].read_text() == tables.markdown(report)


def same_data(source: dict, other: dict) -> bool:
  """Whether two runs' data descriptions differ only in their seed's draw."""
  return ({k: v for k, v in source.items() if k != "data_seed"}
          == {k: v for k, v in other.items() if k != "data_seed"})


# Studies committed with their runs: the paper preset's, and grid studies beside it (a
# folder with its grid.json, trained with `--preset paper --grid`).
GRID_FOLDERS = sorted(p.parent.name for p in RESULTS.glob("*/grid.json"))


CACHED_REPORTS = ([(s, "paper") for s, preset in COMMITTED.items() if preset == "paper"]
                  + [("tradeoffs", folder) for folder in GRID_FOLDERS])


def committed_preset(folder: str):
  """The preset a committed study folder trained with (the paper's, or its grid's)."""
  grid = RESULTS / folder / "grid.json"
  return Grid.read(grid).preset(PAPER) if grid.exists() else PAPER


def committed_runs(folder: str) -> list[dict]:
  """A committed study folder's cached runs, each with its key and metrics."""
  return [json.loads(p.read_text()) for p in (RESULTS / folder / "runs").glob("*.json")]


@pytest.mark.parametrize("study, folder", CACHED_REPORTS)
def test_committed_reports_with_a_run_cache_are_their_runs(study, folder):
  # Every seed's AUC of every point is a committed run's, so a study resumes from the cache.
  report = json.loads(output_paths(study, RESULTS / folder)["json"].read_text())
  cached = committed_runs(folder)
  seeds = list(committed_preset(folder).seeds)
  assert report["points"]
  for point in report["points"]:
    fields = {k: point[k] for k in ("algorithm", "epsilon", "fest_k", "tau_sigmas",
                                    "sigma_ratio")}
    runs = {r["settings"]["seed"]: r["metrics"] for r in cached
            if same_data(r["source"], report["source"])
            and {k: r["point"][k] for k in fields} == fields
            and [list(f) for f in r["point"]["flags"]] == [list(f) for f in point["flags"]]}
    assert [runs[seed]["auc"] for seed in point["seeds"]] == point["auc"], point["label"]
    assert point["seeds"] == seeds


def test_committed_grid_studies_are_listed():
  assert {"paper_dpsgd_epochs", "paper_dpsgd_5_epochs", "paper_dpsgd_examples",
          "paper_dpsgd_examples_rowwise_adagrad_lr3"} <= set(GRID_FOLDERS)


@pytest.mark.parametrize("preset,folder", [(PAPER, "paper"), (FULL, ".")])
def test_committed_streaming_reports_are_their_stream_summaries(preset, folder):
  # Every point is drawn from the committed summaries (OUT/streams/*/study_summary.json).
  report = json.loads(output_paths("streaming", RESULTS / folder)["json"].read_text())
  drawn = json.loads(json.dumps(streaming(preset, "synthetic", RESULTS / folder,
                                          from_cache=True)))
  assert drawn["points"] == report["points"] and drawn["missing"] == report["missing"]


def test_the_committed_vocabulary_scale_runs_train_past_the_transient():
  # On 5,000 examples (13 steps) the full preset's throughput runs ranked the held-out
  # examples backwards (AUC 0.42, docs/paper_study.md); on the sweeps' 60,000 they learn.
  report = json.loads(output_paths("step-time", RESULTS)["json"].read_text())
  assert report["preset"]["throughput_examples"] == FULL.throughput_examples == FULL.examples
  assert {p["vocabulary_scale"] for p in report["points"]} == set(FULL.throughput_scales)
  assert min(p["auc_mean"] for p in report["points"]) > 0.53


@pytest.mark.parametrize("folder", ["paper"] + GRID_FOLDERS)
def test_committed_runs_are_keyed_by_their_draws_description(folder):
  # In a fresh clone the draws are not there (data/ is not committed): --from-cache keys
  # each seed's runs by the draw's description, which must be what the report's runs
  # recorded when they were drawn (the report's source is its first seed's).
  preset = committed_preset(folder)
  described = {seed: StudyInputs.described(preset.examples, preset.synthetic_scale,
                                           preset.features, preset.max_examples, seed,
                                           preset.test_split).source
               for seed in preset.seeds}
  report = json.loads(output_paths("tradeoffs", RESULTS / folder)["json"].read_text())
  assert described[preset.seeds[0]] == report["source"]
  cached = committed_runs(folder)
  for seed, source in described.items():
    assert source in [r["source"] for r in cached if r["settings"]["seed"] == seed], seed


def test_settings_added_after_the_first_cached_runs_keep_their_keys_at_the_first_values():
  from sparse_dp.jobs.study.runner.runs import _settings_key
  from sparse_dp.jobs.train.job_flags import FitSettings
  # The committed paper cache was keyed before FitSettings had these fields.
  assert not {"optimizer", "embedding_dim"} & set(_settings_key(FitSettings()))
  changed = _settings_key(FitSettings(optimizer="rowwise-adagrad", embedding_dim=8))
  assert changed["optimizer"] == "rowwise-adagrad" and changed["embedding_dim"] == 8
