"""``sparse_dp.jobs.study``: sweeps' analysis, tables and figures from JSON, cached runs, CLI."""

import dataclasses
import json
import pathlib
import shutil

import pytest

from sparse_dp.cli import main
from sparse_dp.jobs.study.presets import SMOKE
from sparse_dp.jobs.study.reports import plots, tables
from sparse_dp.jobs.study.runner.grid import Grid
from sparse_dp.jobs.study.runner.inputs import StudyInputs
from sparse_dp.jobs.study.runner.runs import Point, Runner
from sparse_dp.jobs.study.step_time import throughput
from sparse_dp.jobs.study.streaming import stream_folder, streaming
from sparse_dp.jobs.study.studies import output_paths, run_study, trained_with
from sparse_dp.jobs.train import job_flags
from sparse_dp.jobs.train.memory import (
  bytes_needed,
  memory_limit_bytes,
  refusal,
)
from sparse_dp.models.pctr_data import hashed_vocabulary

from support.stacks import one_stack
from support.study_checks import assert_figure_matches_report, report_point

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "study"


def test_a_run_is_trained_once_and_then_read_from_its_cache(tmp_path):
  # 90 training examples: the smoke preset's batch of 64 fits (a larger one is refused).
  inputs = StudyInputs.load("synthetic", 100, 0.01, (2,), tmp_path / "data")
  assert inputs.vocabulary_sizes == (hashed_vocabulary(0.01).sizes[2],)
  assert inputs.source["train_examples"] == 90 and inputs.train[0]["categorical"].shape == (90, 1)
  runner = Runner(inputs, SMOKE, tmp_path)
  first = runner.summary(Point("none", None))
  (cached,) = list((tmp_path / "runs").glob("*.json"))
  assert json.loads(cached.read_text())["metrics"]["auc"] == first["auc"][0]
  cached.write_text(cached.read_text().replace(str(first["auc"][0]), "0.123"))
  # A new runner (a later study) reads the file; this one keeps what it read or trained.
  assert Runner(inputs, SMOKE, tmp_path).summary(Point("none", None))["auc"] == [0.123]
  assert runner.summary(Point("none", None))["auc"] == first["auc"]


def test_bad_data_and_features_are_refused_naming_the_input(tmp_path, capsys):
  assert main(["study", "tradeoffs", "--data", str(tmp_path / "no_such_*.gz"),
               "--out", str(tmp_path)]) == 2
  assert "--data" in capsys.readouterr().err
  with pytest.raises(ValueError, match="features"):
    StudyInputs.load("synthetic", 30, 0.01, (26,), tmp_path / "data")
  with pytest.raises(SystemExit):
    main(["study", "heatmap", "--preset", "huge"])


def test_scales_that_cannot_fit_are_reported_not_run_and_the_others_train(tmp_path):
  preset = dataclasses.replace(trained_with(SMOKE, "rowwise-adagrad", 0.05),
                               throughput_scales=(0.01, 0.1))
  small, large = ([hashed_vocabulary(s).sizes[f] for f in SMOKE.features] for s in (0.01, 0.1))
  points, not_run, missing = throughput(
      preset, "synthetic", tmp_path, memory_limit=bytes_needed(large, "adafest",
                                                                "rowwise-adagrad") - 1)
  assert missing == []
  assert [(p["vocabulary_scale"], p["algorithm"]) for p in points] == [(0.01, "adafest")]
  (cached,) = (json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*.json"))
  assert (cached["settings"]["optimizer"], cached["settings"]["learning_rate"]) == (
      "rowwise-adagrad", 0.05)
  (refused,) = not_run
  assert refused["vocabulary_scale"] == 0.1 and refused["table_rows"] == sum(large)
  assert refused["algorithms"] == [points[0]["label"]]
  assert "rowwise-adagrad's one accumulator per row" in refused["reason"]
  runs_before = sorted((tmp_path / "runs").glob("*.json"))
  assert throughput(preset, "synthetic", tmp_path, memory_limit=1) == ([], [
      {**refused, "vocabulary_scale": s, "table_rows": sum(v), "memory_limit_bytes": 1,
       "bytes_needed": bytes_needed(v, "adafest", "rowwise-adagrad"),
       "reason": refusal(v, 1, "adafest", "rowwise-adagrad")}
      for s, v in ((0.01, small), (0.1, large))], [])
  # From the cache: the cached point is read, the one that would fit but is not cached
  # is listed, and nothing trains.
  cached_only, _, not_cached = throughput(preset, "synthetic", tmp_path, from_cache=True)
  assert cached_only == points and not_cached == [f"{points[0]['label']} at x0.1"]
  assert sorted((tmp_path / "runs").glob("*.json")) == runs_before
  assert sorted((tmp_path / "runs").glob("*.json")) == runs_before
  # DP-SGD needs more (its dense noise): its own reason, beside DP-AdaFEST's.
  both = dataclasses.replace(preset, throughput_algorithms=("dpsgd", "adafest"))
  nothing, refusals, _ = throughput(both, "synthetic", tmp_path, memory_limit=1)
  assert nothing == [] and [(r["vocabulary_scale"], r["algorithms"]) for r in refusals] == [
      (s, a) for s in (0.01, 0.1) for a in (["dpsgd"], [points[0]["label"]])]
  assert "DP-SGD's dense noise" in refusals[0]["reason"]
  report = {"study": "step-time", "preset": preset.describe(),
            "bench": {"results": [], "optimizer": "sgd"}, "table4": [], "points": points,
            "not_run": not_run}
  table = tables.markdown(report)
  assert table.startswith("Trained with `--optimizer rowwise-adagrad --learning-rate 0.05`.")
  assert "| 0.1 | " + f"{sum(large)} | {points[0]['label']} | {refused['reason']} |" in table
  figure = plots.figure(report)
  assert (f"x0.1 {points[0]['label']} not run: {refused['reason']}"
          in {t.get_text() for t in figure.axes[1].texts})
  plots._pyplot().close(figure)
  assert 0 < memory_limit_bytes()


@pytest.mark.slow
@one_stack("tf2.15")
def test_a_grid_file_is_trained_end_to_end_at_the_smoke_scale(tmp_path, capsys):
  grid = tmp_path / "grid.yaml"
  grid.write_text("algorithm: [dpsgd, adafest]\ntau-sigmas: [2, 6]\nseeds: 1\n"
                  "examples: 400\nmax_examples: 200\n")
  assert main(["study", "tradeoffs", "--grid", str(grid), "--out", str(tmp_path)]) == 0
  paths = output_paths("tradeoffs", tmp_path)
  report = json.loads(paths["json"].read_text())
  # DP-SGD reads no tau: the grid's 2 x 2 combinations are 3 points.
  assert [p["label"] for p in report["points"]] == [
      "dpsgd", "adafest tau=2s", "adafest tau=6s"]  # the ratio by rule
  # 400 synthetic lines drawn (the preset's 300 replaced), 200 of them read.
  assert report["grid"] == str(grid) and report["source"]["train_examples"] == 180
  assert report["source"]["examples"] == 400
  assert report["preset"]["seeds"] == [0] and report["preset"]["name"] == "smoke+grid"
  assert {r["algorithm"] for r in report["best_reduction"]} == {"adafest"}
  assert_figure_matches_report(paths["json"], paths["png"])
  assert "wrote" in capsys.readouterr().out
  # Killed mid-way: one run's file never written (its .partial half-written), the
  # others finished. --from-cache trains nothing and lists the point as missing; the
  # re-run trains that run only and reports what the uninterrupted run reported.
  runs = sorted((tmp_path / "runs").glob("*.json"), key=lambda p: p.stat().st_mtime_ns)
  killed, finished = runs[-1], runs[:-1]
  stamps = {p: p.stat().st_mtime_ns for p in finished}
  killed.rename(killed.with_suffix(".partial"))
  killed.with_suffix(".partial").write_text(killed.with_suffix(".partial").read_text()[:50])
  shutil.rmtree(tmp_path / "data")  # --from-cache describes the draw, not draws it
  assert main(["study", "tradeoffs", "--grid", str(grid), "--out", str(tmp_path),
               "--from-cache"]) == 0
  cached = json.loads(paths["json"].read_text())
  assert cached["missing"] == ["adafest tau=6s"] and len(cached["points"]) == 2
  assert cached["source"] == report["source"] and not (tmp_path / "data").exists()
  assert main(["study", "tradeoffs", "--grid", str(grid), "--out", str(tmp_path)]) == 0
  resumed = json.loads(paths["json"].read_text())
  assert killed.exists() and {p: p.stat().st_mtime_ns for p in finished} == stamps

  def without_timing(points):
    timing = ("examples_per_second", "first_step_seconds", "examples_per_second_after_first_step")
    return [{k: v for k, v in p.items() if k not in timing} for p in points]
  assert without_timing(resumed["points"]) == without_timing(report["points"])
  assert resumed["best_reduction"] == report["best_reduction"] and resumed["missing"] == []


def test_a_grid_takes_train_flags_only_where_an_algorithm_reads_them(tmp_path, capsys):
  grid = Grid.parse({"algorithm": ["none", "dpsgd", "adafest+"], "epsilon": 2,
                     "selection_share": 0.05, "tau": [0.5], "learning_rate": "1e-3",
                     "seeds": [3, 5]})
  assert grid.seeds == (3, 5) and grid.preset(SMOKE).seeds == (3, 5)
  assert grid.preset(SMOKE).max_examples == SMOKE.max_examples
  assert grid.preset(SMOKE).examples == SMOKE.examples
  assert Grid.parse({"algorithm": "dpsgd", "examples": 500}).preset(SMOKE).examples == 500
  none, dpsgd, plus = grid.points
  assert none == Point("none", None, flags=(("learning_rate", "1e-3"),))
  assert dpsgd == Point("dpsgd", 2.0, flags=(("learning_rate", "1e-3"),))
  assert plus.fest_k == 300 and plus.tau_sigmas is None and plus.flags == (
      ("learning_rate", "1e-3"), ("selection_share", 0.05), ("tau", 0.5))
  runner = Runner(StudyInputs.load("synthetic", 30, 0.01, (2,), tmp_path / "data"), SMOKE,
                  tmp_path)
  args = runner.arguments(plus, 3)
  assert (args.selection_share, args.tau, args.learning_rate, args.seed) == (0.05, 0.5, 1e-3, 3)
  assert runner.arguments(Point("fest", 1.0, fest_k=20), 0).selection_share == 0.01
  # Two DP-SGD points leave the AUC loss without one baseline.
  two = tmp_path / "two.json"
  two.write_text(json.dumps({"algorithm": ["dpsgd", "adafest"], "epsilon": [1, 2]}))
  assert main(["study", "tradeoffs", "--grid", str(two), "--out", str(tmp_path)]) == 2
  assert "exactly one" in capsys.readouterr().err
  assert not list((tmp_path / "runs").glob("*.json"))


def test_a_grid_sets_the_optimizer_of_its_runs(tmp_path):
  grid = Grid.parse({"algorithm": "adafest", "optimizer": ["adam", "rowwise-adagrad"]})
  assert [dict(p.flags)["optimizer"] for p in grid.points] == ["adam", "rowwise-adagrad"]
  runner = Runner(StudyInputs.load("synthetic", 30, 0.01, (2,), tmp_path / "data"), SMOKE,
                  tmp_path)
  args = runner.arguments(grid.points[1], 0)
  assert job_flags.fit_settings(args, epsilon=1.0).optimizer == "rowwise-adagrad"
  # The report's first line names the preset's optimizer and says the points' replace it.
  points = [report_point("adafest", 0.6, 10.0, label=p.label)
            | {"flags": [list(f) for f in p.flags]} for p in grid.points]
  opening = tables._trained_with(
      {"preset": SMOKE.describe(), "points": points})
  assert opening.strip() == ("Trained with `--optimizer adam --learning-rate 0.01`, except "
                             "where a point's label gives its own optimizer.")


def test_the_studys_optimizer_trains_every_run_and_keeps_adams_cache_keys(tmp_path, capsys):
  rowwise = trained_with(SMOKE, "rowwise-adagrad")
  assert (rowwise.optimizer, rowwise.learning_rate) == ("rowwise-adagrad", SMOKE.learning_rate)
  assert trained_with(SMOKE, learning_rate=0.1).optimizer == SMOKE.optimizer == "adam"
  with pytest.raises(ValueError, match="--learning-rate must be > 0"):
    trained_with(SMOKE, "sgd", -1.0)
  runner = Runner(StudyInputs.load("synthetic", 30, 0.01, (2,), tmp_path / "data"), rowwise,
                  tmp_path)
  assert runner.arguments(Point("adafest", 1.0), 0).optimizer == "rowwise-adagrad"
  assert runner.arguments(Point("adafest", 1.0, flags=(("optimizer", "sgd"),)), 0).optimizer \
      == "sgd"  # a grid's point sets its own
  # A stream's folder at Adam on all 26 tables is the one named before the studies took
  # --optimizer and a preset's stream_features; another optimizer or table count, another.
  all_tables = dataclasses.replace(SMOKE, stream_features=None)
  assert stream_folder(all_tables, "synthetic", "fest", "running", 0, 1) == \
      "fest-running-seed0-7a05c2e7cc"
  for other in (dataclasses.replace(rowwise, stream_features=None), SMOKE):
    assert stream_folder(other, "synthetic", "fest", "running", 0, 1) != \
        "fest-running-seed0-7a05c2e7cc"
  with pytest.raises(SystemExit):
    main(["study", "heatmap", "--optimizer", "adamw"])
  assert "--optimizer" in capsys.readouterr().err
  assert main(["study", "step-time", "--learning-rate", "0", "--out", str(tmp_path)]) == 2
  assert "--learning-rate must be > 0" in capsys.readouterr().err


@pytest.mark.slow
@one_stack("tf2.15")
def test_streams_train_seed_by_seed_resume_and_draw_from_their_cache(tmp_path):
  two_seeds = dataclasses.replace(SMOKE, seeds=(0, 1), stream_periods=(1,),
                                  streams=(("fest", "running"),))
  first = streaming(two_seeds, "synthetic", tmp_path)
  assert not first["missing"] and [p["seeds"] for p in first["points"]] == [[0, 1]]
  assert first["source"] == {"train_examples": 200, "held_out_examples": 100}
  folders = {seed: tmp_path / "streams" / stream_folder(two_seeds, "synthetic", "fest",
                                                         "running", seed, 1)
             for seed in (0, 1)}
  # A finished stream keeps its summary, ledger, metrics and its last period's model
  # (earlier periods' models are dropped: test_stream_job).
  assert [p.parent.name for p in folders[0].glob("periods/*/weights.npz")] == ["1"]
  assert list(folders[0].glob("periods/*/metrics.json"))
  shutil.rmtree(folders[1])  # a stream never trained (an interrupted one resumes its state)
  cached = streaming(two_seeds, "synthetic", tmp_path, from_cache=True)
  assert cached["missing"] == ["1 stream of seeds 1"]
  assert [p["seeds"] for p in cached["points"]] == [[0]]
  assert not (folders[1] / "study_summary.json").exists()  # from the cache: nothing trained
  kept = (folders[0] / "study_summary.json").stat().st_mtime_ns
  resumed = streaming(two_seeds, "synthetic", tmp_path)
  assert not resumed["missing"] and (folders[0] / "study_summary.json").stat().st_mtime_ns == kept
  # Seed 0's streams are read back; seed 1's retrained with fresh noise (a stream's noise
  # is keyed by a secret seed of its state, not by --seed).
  assert [p["seeds"] for p in resumed["points"]] == [[0, 1]]
  assert [p["auc"][0] for p in resumed["points"]] == [p["auc"][0] for p in first["points"]]


@pytest.mark.slow
@one_stack("tf2.21")  # the tradeoffs grid test runs on tf2.15
def test_the_epsilon_and_heatmap_studies_take_a_grid(tmp_path):
  epsilons = tmp_path / "epsilons.yaml"
  epsilons.write_text("algorithm: [dpsgd, adafest]\nepsilon: [1, 4]\nsigma_ratio: 2\n"
                      "tau_sigmas: 4\nseeds: 1\n")
  assert main(["study", "epsilon", "--grid", str(epsilons), "--out", str(tmp_path)]) == 0
  report = json.loads(output_paths("epsilon", tmp_path)["json"].read_text())
  assert report["epsilons"] == [1.0, 4.0] and len(report["points"]) == 4
  cells = tmp_path / "cells.yaml"
  cells.write_text("algorithm: adafest\nsigma_ratio: [2, 5]\ntau_sigmas: 4\nseeds: 1\n")
  assert main(["study", "heatmap", "--grid", str(cells), "--out", str(tmp_path)]) == 0
  paths = output_paths("heatmap", tmp_path)
  heat = json.loads(paths["json"].read_text())
  assert (heat["sigma_ratios"], heat["tau_sigmas"], heat["epsilon"]) == ([2.0, 5.0], [4.0], 1.0)
  # The cell (2, 4) is the epsilon grid's adafest point at epsilon 1: read, not retrained.
  assert len(list((tmp_path / "runs").glob("*.json"))) == 5
  assert_figure_matches_report(paths["json"], paths["png"])


def test_a_grid_draws_synthetic_examples_but_reads_files_whole(tmp_path, capsys):
  # `examples` sets how many synthetic lines are drawn; Criteo files are read, so a grid
  # with examples over --data files is refused naming max_examples, before a run.
  path = tmp_path / "grid.yaml"
  path.write_text("algorithm: dpsgd\nexamples: 1000\n")
  day = tmp_path / "day_0"
  day.write_text("")
  assert main(["study", "tradeoffs", "--grid", str(path), "--data", str(day),
               "--out", str(tmp_path)]) == 2
  assert "cap its lines with max_examples" in capsys.readouterr().err
  assert not (tmp_path / "runs").exists()


CELL = "sigma_ratio: 2\ntau_sigmas: 4\n"  # a heatmap cell's axes


@pytest.mark.parametrize("study, grid, named", [
    ("epsilon", "algorithm: [none, adafest]\n", "none has none"),
    ("heatmap", f"algorithm: [dpsgd, adafest]\n{CELL}", "dpsgd has no cell"),
    ("heatmap", "algorithm: adafest\ntau: [5]\nsigma_ratio: 2\n", "has no cell"),
    ("heatmap", "algorithm: adafest\n", "give algorithm adafest with tau_sigmas"),  # the rule's
    ("heatmap", f"algorithm: adafest\nepsilon: [1, 2]\n{CELL}", "one epsilon"),
    ("heatmap", f"algorithm: adafest\nlearning_rate: [0.1, 0.01]\n{CELL}", "share one"),
    ("streaming", "algorithm: adafest\n", "gives the points of tradeoffs"),
])
def test_a_grid_a_study_cannot_draw_is_refused_before_training(tmp_path, capsys, study, grid,
                                                               named):
  path = tmp_path / "grid.yaml"
  path.write_text(grid)
  if study == "streaming":  # the command has no --grid: run_study refuses it by name
    with pytest.raises(ValueError, match=named):
      run_study(study, grid=path, out=tmp_path)
  else:
    assert main(["study", study, "--grid", str(path), "--out", str(tmp_path)]) == 2
    assert named in capsys.readouterr().err
  assert not (tmp_path / "runs").exists()  # refused before a run or its folder
