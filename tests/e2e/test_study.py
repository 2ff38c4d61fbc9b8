"""``sparse_dp.jobs.study``: sweeps' analysis, tables and figures from JSON, cached runs, CLI."""

import dataclasses
import json
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp.cli import main
from sparse_dp.data.synthetic import SyntheticCriteo
from sparse_dp.jobs.study.presets import FULL, PAPER, PAPER_SELECTION_SHARE, SMOKE
from sparse_dp.jobs.study.reports import plots, tables
from sparse_dp.jobs.study.runner.grid import Grid
from sparse_dp.jobs.study.runner.inputs import StudyInputs
from sparse_dp.jobs.study.runner.runs import Point, Runner, paired_difference
from sparse_dp.jobs.study.step_time import throughput
from sparse_dp.jobs.study.streaming import stream_folder, streaming
from sparse_dp.jobs.study.studies import output_paths, publish, run_study, trained_with
from sparse_dp.jobs.study.sweeps import best_reduction, default_point, refined_points, sweep_points
from sparse_dp.jobs.train import job_flags
from sparse_dp.jobs.train.fitting import job_optimizer
from sparse_dp.jobs.train.memory import (
  DRAW_TEMPORARIES,
  OVERHEAD_BYTES,
  bytes_needed,
  memory_limit_bytes,
  optimizer_bytes,
  refusal,
  table_bytes,
)
from sparse_dp.models.pctr import build_pctr_model
from sparse_dp.models.pctr_data import hashed_vocabulary
from sparse_dp.optimizers import sparse_optimizer

from support.stacks import one_stack
from support.study_checks import assert_figure_matches_report

RESULTS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "study"


def _point(algorithm, auc, reduction, label=None, std=0.01, epsilon=1.0):
  return {"algorithm": algorithm, "label": label or algorithm, "auc": [auc - std, auc + std],
          "auc_mean": auc, "auc_std": std, "epsilon": epsilon, "epsilon_spent": epsilon,
          "gradient_size_reduction": reduction, "gradient_size_reduction_std": reduction / 10,
          "examples_per_second": 100.0, "fest_k": None, "tau_sigmas": None, "sigma_ratio": None}


def test_best_reduction_takes_the_sparsest_point_within_the_auc_loss():
  points = [_point("dpsgd", 0.70, 1.0), _point("adafest", 0.699, 50.0, "a1"),
            _point("adafest", 0.69, 5000.0, "a2"), _point("fest", 0.60, 80.0)]
  rows = {(r["algorithm"], r["auc_loss_threshold"]): r
          for r in best_reduction(points, (0.005, 0.02))}
  assert rows[("adafest", 0.005)]["label"] == "a1"
  assert rows[("adafest", 0.02)]["gradient_size_reduction"] == 5000.0
  assert rows[("fest", 0.02)]["label"] is None  # nothing within 0.02 of DP-SGD


def test_figure_and_table_are_drawn_from_the_written_json(tmp_path):
  points = [_point("none", 0.75, 1.0, epsilon=None), _point("dpsgd", 0.70, 1.0),
            _point("adafest", 0.69, 5000.0, "a2")]
  report = {"study": "tradeoffs", "epsilon": 1.0, "points": points,
            "best_reduction": best_reduction(points, (0.01, 0.05))}
  paths = publish(report, tmp_path)
  assert paths == output_paths("tradeoffs", tmp_path)
  assert_figure_matches_report(paths["json"], paths["png"])
  table = paths["md"].read_text()
  assert "| a2 | 1 | 1 | 0.6900 ± 0.0100 (n=2) | 5,000 ± 500 |" in table
  assert plots.configuration({"label": "adafest tau=2s s1/s2=2"}) == "tau=2s s1/s2=2"


def test_heatmap_and_epsilon_reports_show_every_point(tmp_path):
  cells = [{**_point("adafest", 0.6 + r / 100 + t / 1000, 10.0 * t * r), "sigma_ratio": r,
            "tau_sigmas": t} for r in (2.0, 5.0) for t in (2.0, 6.0)]
  heat = publish({"study": "heatmap", "epsilon": 1.0, "sigma_ratios": [2.0, 5.0],
                  "tau_sigmas": [2.0, 6.0], "points": cells}, tmp_path)
  assert_figure_matches_report(heat["json"], heat["png"])
  grids = tables.markdown(json.loads(heat["json"].read_text()))
  assert grids.count("(n=2)") == 4 and "| 5 | 100 ± 10 | 300 ± 30 |" in grids
  sweep = [{**_point(a, 0.7, 3.0 * e), "epsilon": e} for e in (1.0, 4.0)
           for a in ("dpsgd", "adafest")]
  paths = publish({"study": "epsilon", "epsilons": [1.0, 4.0], "points": sweep}, tmp_path)
  assert_figure_matches_report(paths["json"], paths["png"])


@pytest.mark.parametrize("preset", [SMOKE, FULL])
def test_sweeps_share_their_first_points_so_a_folder_trains_each_once(preset):
  tradeoff = {default_point(a, preset.epsilon, preset)
              for a in ("dpsgd", "fest", "adafest", "adafest+")}
  heat = {Point("adafest", preset.epsilon, tau_sigmas=t, sigma_ratio=preset.sigma_ratios[0])
          for t in preset.tau_sigmas}
  assert {default_point(a, preset.epsilon, preset) for a in preset.epsilon_algorithms} <= tradeoff
  assert preset.epsilon in preset.epsilons
  assert default_point("adafest", preset.epsilon, preset) in heat


def test_a_run_is_trained_once_and_then_read_from_its_cache(tmp_path):
  inputs = StudyInputs.load("synthetic", 60, 0.01, (2,), tmp_path / "data")
  assert inputs.vocabulary_sizes == (hashed_vocabulary(0.01).sizes[2],)
  assert inputs.source["train_examples"] == 54 and inputs.train[0]["categorical"].shape == (54, 1)
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


@pytest.mark.parametrize("optimizer", job_flags.OPTIMIZERS)
def test_memory_bound_counts_the_tables_and_the_optimizers_state_of_the_job_model(optimizer):
  sizes = (1_000, 37, 20_000)
  model = build_pctr_model(sizes, (4,))
  tables = [w for w in model.trainable_weights if "embedding" in w.name]
  # A DP run's optimizer: the job's --optimizer in its sparse form.
  compiled = sparse_optimizer(job_optimizer(optimizer, 1e-3))
  ids = tf.constant([0, 2])
  compiled.apply_gradients([(tf.IndexedSlices(tf.ones([2, t.shape[1]]), ids, t.shape), t)
                            for t in tables])
  slots = [compiled.get_slot(t, name) for t in tables for name in compiled.get_slot_names()]
  assert table_bytes(sizes) == 4 * sum(int(np.prod(t.shape)) for t in tables)
  assert optimizer_bytes(sizes, optimizer) == 4 * sum(int(np.prod(v.shape)) for v in slots)
  resident = table_bytes(sizes) + optimizer_bytes(sizes, optimizer)
  assert bytes_needed(sizes, "adafest", optimizer) == resident + OVERHEAD_BYTES
  largest = max(int(np.prod(t.shape)) for t in tables) * 4
  assert bytes_needed(sizes, "dpsgd", optimizer) == (resident + OVERHEAD_BYTES
                                                     + DRAW_TEMPORARIES * largest)
  assert refusal(sizes, resident + OVERHEAD_BYTES, "adafest", optimizer) is None
  assert "21,037 rows" in refusal(sizes, resident + OVERHEAD_BYTES - 1, "adafest", optimizer)


def test_dp_sgd_noise_on_a_table_over_one_chunk_is_its_gradient_and_one_chunks_draw():
  from sparse_dp.mechanisms.noise.dense_noise import CHUNK_ROWS
  from sparse_dp.models.pctr import embedding_dim
  rows = 3 * CHUNK_ROWS + 5
  row_bytes = 4 * embedding_dim(rows)
  assert bytes_needed([rows, 10], "dpsgd", "sgd") - bytes_needed([rows, 10], "adafest", "sgd") \
      == rows * row_bytes + DRAW_TEMPORARIES * CHUNK_ROWS * row_bytes


def test_a_refusal_names_the_optimizer_and_its_state():
  sizes = [hashed_vocabulary(100).sizes[f] for f in FULL.features]
  assert sum(sizes) == 31_610_016
  assert "adam's 2 table-sized slots 22.2" in refusal(sizes, 24 * 10**9, "adafest", "adam")
  assert "adagrad's 1 table-sized slot 11.1" in refusal(sizes, 1, "adafest", "adagrad")
  assert "sgd's no slot 0.00" in refusal(sizes, 1, "adafest", "sgd")
  dense = refusal(sizes, 1, "dpsgd", "rowwise-adagrad")
  assert "rowwise-adagrad's one accumulator per row 0.12" in dense
  assert "DP-SGD's dense noise" in dense and "DP-SGD" not in refusal(sizes, 1, "adafest", "sgd")
  # 100x Table 3 (the full preset's tables): row-wise Adagrad's state is 1/d of Adagrad's,
  # so DP-AdaFEST fits a 24 GB machine with it, and not with Adam.
  assert refusal(sizes, 24 * 10**9, "adafest", "rowwise-adagrad") is None
  # DP-SGD's noise is drawn in chunks into one table-sized gradient: it fits too.
  assert refusal(sizes, 24 * 10**9, "dpsgd", "rowwise-adagrad") is None
  with pytest.raises(ValueError, match="--optimizer 'adamw'"):
    refusal(sizes, 1, "adafest", "adamw")


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
      "dpsgd", "adafest tau=2s s1/s2=2", "adafest tau=6s s1/s2=2"]
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
  assert cached["missing"] == ["adafest tau=6s s1/s2=2"] and len(cached["points"]) == 2
  assert cached["source"] == report["source"] and not (tmp_path / "data").exists()
  assert main(["study", "tradeoffs", "--grid", str(grid), "--out", str(tmp_path)]) == 0
  resumed = json.loads(paths["json"].read_text())
  assert killed.exists() and {p: p.stat().st_mtime_ns for p in finished} == stamps

  def without_timing(points):
    timing = ("examples_per_second", "first_step_seconds", "examples_per_second_after_first_step")
    return [{k: v for k, v in p.items() if k not in timing} for p in points]
  assert without_timing(resumed["points"]) == without_timing(report["points"])
  assert resumed["best_reduction"] == report["best_reduction"] and resumed["missing"] == []


@pytest.mark.parametrize("grid, named", [
    ({"tau_sigma": [2]}, "tau_sigma"),
    ({"data": "train.txt"}, "data"),
    ({"algorithm": ["dpsgd", "sgd"]}, "algorithm: 'sgd'"),
    ({"tau-sigmas": ["x"]}, "tau_sigmas: 'x'"),
    ({"selection_share": 1.5}, "selection_share"),
    ({"hidden_units": "8,0"}, "hidden_units"),
    ({"fest_k": []}, "fest_k has no value"),
    ({"seeds": 0}, "seeds 0"),
    ({"max_examples": 5}, "max_examples 5"),
    ({"examples": 2.5e6}, "examples 2500000.0"),
    ({"optimizer": "adamw"}, "optimizer: 'adamw'"),
    ([1, 2], "mapping"),
])
def test_a_bad_grid_is_refused_naming_the_flag(grid, named):
  with pytest.raises(ValueError, match=named.replace("(", r"\(")):
    Grid.parse(grid, "--grid g.yaml")


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
  points = [_point("adafest", 0.6, 10.0, label=p.label) | {"flags": [list(f) for f in p.flags]}
            for p in grid.points]
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
  # A stream's folder at Adam is the one named before the studies took --optimizer.
  assert stream_folder(SMOKE, "synthetic", "fest", "running", 0, 1) == \
      "fest-running-seed0-7a05c2e7cc"
  assert stream_folder(rowwise, "synthetic", "fest", "running", 0, 1) != \
      "fest-running-seed0-7a05c2e7cc"
  with pytest.raises(SystemExit):
    main(["study", "heatmap", "--optimizer", "adamw"])
  assert "--optimizer" in capsys.readouterr().err
  assert main(["study", "step-time", "--learning-rate", "0", "--out", str(tmp_path)]) == 2
  assert "--learning-rate must be > 0" in capsys.readouterr().err


def test_real_files_are_read_whole_unless_capped(tmp_path):
  path = SyntheticCriteo(scale=0.01, seed=1).write_day(tmp_path / "day_1.gz", 1, 500)
  whole = StudyInputs.load(str(path), 60, 0.01, (2,), tmp_path / "data")
  capped = StudyInputs.load(str(path), 60, 0.01, (2,), tmp_path / "data", max_examples=100)
  assert whole.source["train_examples"] == 450 and capped.source["train_examples"] == 90
  assert SMOKE.selection_share == FULL.selection_share == PAPER_SELECTION_SHARE == 0.01


def test_paired_difference_is_the_t_interval_of_the_seedwise_differences():
  paired = paired_difference([0.70, 0.72, 0.71], [0.69, 0.70, 0.70])
  # differences 0.01, 0.02, 0.01: sd 0.005774, t_{0.975, 2} = 4.3027
  assert paired["mean"] == pytest.approx(0.013333, abs=1e-6) and paired["n"] == 3
  assert paired["high"] - paired["mean"] == pytest.approx(4.3027 * 0.0057735 / 3 ** 0.5, rel=1e-3)
  assert paired_difference([0.7], [0.6])["low"] is None
  with pytest.raises(ValueError, match="paired over seeds"):
    paired_difference([0.7, 0.7], [0.6])


def test_the_paper_preset_grid_spans_the_papers_ranges_and_refines_its_frontier():
  points = sweep_points(PAPER)
  assert len(points) == len(set(points)) == 22
  fest = [p.fest_k for p in points if p.algorithm == "fest"]
  assert min(fest) <= 100 and max(fest) == 300_000
  assert {p.sigma_ratio for p in points if p.algorithm == "adafest"} == {0.1, 1.0, 5.0, 10.0}
  flags = [dict(p.flags) for p in points]
  assert {f["tau"] for f in flags if "tau" in f} == {1.0, 10.0, 100.0}
  assert {f.get("contribution_clip", 1.0) for f in flags} == {1.0, 5.0, 10.0}
  # C1 is swept at one absolute tau (in sigma units every C1 would be the same point).
  assert {(f["tau"], f.get("contribution_clip", 1.0)) for f in flags if "tau" in f} >= {
      (100.0, 1.0), (100.0, 5.0), (100.0, 10.0)}
  assert all("tau" in f for f in flags if "contribution_clip" in f)
  assert {f["selection_share"] for f in flags if "selection_share" in f} == {0.5}
  coarse = [{**_point("dpsgd", 0.70, 1.0), "flags": ()}] + [
      {**_point("adafest", auc, reduction, f"adafest tau={t:g}s s1/s2=5"), "flags": (),
       "tau_sigmas": t, "sigma_ratio": 5.0}
      for t, auc, reduction in ((2.0, 0.699, 100.0), (8.0, 0.68, 10_000.0))]
  (refined,) = refined_points(coarse, PAPER)
  assert refined == Point("adafest", PAPER.epsilon, tau_sigmas=4.0, sigma_ratio=5.0)
  # Along a sweep of the absolute tau (C1 = 5 alone on its own sweep: nothing to bracket).
  absolute = [{**_point("adafest", auc, reduction, f"adafest tau={t} {c}"), "sigma_ratio": 5.0,
               "flags": [["tau", t]] + ([["contribution_clip", c]] if c != 1.0 else [])}
              for t, c, auc, reduction in ((10.0, 1.0, 0.699, 30.0), (100.0, 1.0, 0.68, 4e4),
                                           (100.0, 5.0, 0.699, 2e3))]
  (tau_midpoint,) = refined_points(coarse[:1] + absolute, PAPER)
  assert tau_midpoint == Point("adafest", PAPER.epsilon, sigma_ratio=5.0,
                               flags=(("tau", 31.6),))


def test_paper_inputs_are_drawn_per_seed_and_split_into_validation_and_test(tmp_path):
  one = StudyInputs.load("synthetic", 200, 0.01, (2,), tmp_path, data_seed=1, test_split=True)
  zero = StudyInputs.load("synthetic", 200, 0.01, (2,), tmp_path, test_split=True)
  assert len(one.train[1]) == 180 and len(one.held_out[1]) == len(one.test[1]) == 10
  assert one.source["data_seed"] == 1 and "data_seed" not in zero.source
  assert not np.array_equal(one.train[0]["categorical"], zero.train[0]["categorical"])
  assert not np.array_equal(one.held_out[0]["categorical"], one.test[0]["categorical"])


@pytest.mark.parametrize("settings", [
    dict(), dict(data_seed=3, test_split=True), dict(max_examples=150, test_split=True),
    dict(max_examples=500, data_seed=2)])
def test_a_synthetic_draw_is_described_as_drawn_without_drawing_it(tmp_path, settings):
  described = StudyInputs.described(200, 0.01, (2, 5), **settings)
  assert not (tmp_path / "data").exists()
  drawn = StudyInputs.load("synthetic", 200, 0.01, (2, 5), tmp_path / "data", **settings)
  assert described.source == drawn.source and described.rows == drawn.rows
  assert described.train is described.held_out is described.test is None
  counts = [len(drawn.train[1]), len(drawn.held_out[1])] + (
      [len(drawn.test[1])] if settings.get("test_split") else [])
  assert sum(counts) == min(200, settings.get("max_examples") or 200)


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
  epsilons.write_text("algorithm: [dpsgd, adafest]\nepsilon: [1, 4]\nseeds: 1\n")
  assert main(["study", "epsilon", "--grid", str(epsilons), "--out", str(tmp_path)]) == 0
  report = json.loads(output_paths("epsilon", tmp_path)["json"].read_text())
  assert report["epsilons"] == [1.0, 4.0] and len(report["points"]) == 4
  cells = tmp_path / "cells.yaml"
  cells.write_text("algorithm: adafest\nsigma_ratio: [2, 5]\ntau_sigmas: 4\nseeds: 1\n")
  assert main(["study", "heatmap", "--grid", str(cells), "--out", str(tmp_path)]) == 0
  paths = output_paths("heatmap", tmp_path)
  heat = json.loads(paths["json"].read_text())
  assert (heat["sigma_ratios"], heat["tau_sigmas"], heat["epsilon"]) == ([2.0, 5.0], [4.0], 1.0)
  # The cell (2, 4) is the epsilon grid's adafest point at epsilon 1 (sparse-dp train's
  # defaults): read, not retrained.
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


@pytest.mark.parametrize("study, grid, named", [
    ("epsilon", "algorithm: [none, adafest]\n", "none has none"),
    ("heatmap", "algorithm: [dpsgd, adafest]\n", "dpsgd has no cell"),
    ("heatmap", "algorithm: adafest\ntau: [5]\n", "has no cell"),
    ("heatmap", "algorithm: adafest\nepsilon: [1, 2]\n", "one epsilon"),
    ("heatmap", "algorithm: adafest\nlearning_rate: [0.1, 0.01]\n", "share one"),
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
