"""The studies' parts: sweeps, reports, grids, presets, inputs and the job's memory bound."""

import json

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp.data.synthetic import SyntheticCriteo
from sparse_dp.jobs.study.presets import FULL, PAPER, PAPER_SELECTION_SHARE, SMOKE
from sparse_dp.jobs.study.reports import plots, tables
from sparse_dp.jobs.study.runner.grid import Grid
from sparse_dp.jobs.study.runner.inputs import StudyInputs
from sparse_dp.jobs.study.runner.runs import Point, paired_difference
from sparse_dp.jobs.study.studies import output_paths, publish
from sparse_dp.jobs.study.sweeps import best_reduction, default_point, refined_points, sweep_points
from sparse_dp.jobs.train import job_flags
from sparse_dp.jobs.train.fitting import job_optimizer
from sparse_dp.jobs.train.memory import (
  DRAW_TEMPORARIES,
  OVERHEAD_BYTES,
  bytes_needed,
  optimizer_bytes,
  refusal,
  table_bytes,
)
from sparse_dp.models.pctr import build_pctr_model
from sparse_dp.models.pctr_data import hashed_vocabulary
from sparse_dp.optimizers import sparse_optimizer

from support.study_checks import assert_figure_matches_report, report_point


def test_best_reduction_takes_the_sparsest_point_within_the_auc_loss():
  points = [report_point("dpsgd", 0.70, 1.0), report_point("adafest", 0.699, 50.0, "a1"),
            report_point("adafest", 0.69, 5000.0, "a2"), report_point("fest", 0.60, 80.0)]
  rows = {(r["algorithm"], r["auc_loss_threshold"]): r
          for r in best_reduction(points, (0.005, 0.02))}
  assert rows[("adafest", 0.005)]["label"] == "a1"
  assert rows[("adafest", 0.02)]["gradient_size_reduction"] == 5000.0
  assert rows[("fest", 0.02)]["label"] is None  # nothing within 0.02 of DP-SGD


def test_figure_and_table_are_drawn_from_the_written_json(tmp_path):
  points = [report_point("none", 0.75, 1.0, epsilon=None), report_point("dpsgd", 0.70, 1.0),
            report_point("adafest", 0.69, 5000.0, "a2")]
  report = {"study": "tradeoffs", "epsilon": 1.0, "points": points,
            "best_reduction": best_reduction(points, (0.01, 0.05))}
  paths = publish(report, tmp_path)
  assert paths == output_paths("tradeoffs", tmp_path)
  assert_figure_matches_report(paths["json"], paths["png"])
  table = paths["md"].read_text()
  assert "| a2 | 1 | 1 | 0.6900 ± 0.0100 (n=2) | 5,000 ± 500 |" in table
  assert plots.configuration({"label": "adafest tau=2s s1/s2=2"}) == "tau=2s s1/s2=2"


def test_heatmap_and_epsilon_reports_show_every_point(tmp_path):
  cells = [{**report_point("adafest", 0.6 + r / 100 + t / 1000, 10.0 * t * r), "sigma_ratio": r,
            "tau_sigmas": t} for r in (2.0, 5.0) for t in (2.0, 6.0)]
  heat = publish({"study": "heatmap", "epsilon": 1.0, "sigma_ratios": [2.0, 5.0],
                  "tau_sigmas": [2.0, 6.0], "points": cells}, tmp_path)
  assert_figure_matches_report(heat["json"], heat["png"])
  grids = tables.markdown(json.loads(heat["json"].read_text()))
  assert grids.count("(n=2)") == 4 and "| 5 | 100 ± 10 | 300 ± 30 |" in grids
  sweep = [{**report_point(a, 0.7, 3.0 * e), "epsilon": e} for e in (1.0, 4.0)
           for a in ("dpsgd", "adafest")]
  paths = publish({"study": "epsilon", "epsilons": [1.0, 4.0], "points": sweep}, tmp_path)
  assert_figure_matches_report(paths["json"], paths["png"])


@pytest.mark.parametrize("preset", [SMOKE, FULL])
def test_sweeps_share_their_first_points_so_a_folder_trains_each_once(preset):
  tradeoff = {default_point(a, preset.epsilon, preset)
              for a in ("dpsgd", "fest", "adafest", "adafest+")}
  heat = {Point("adafest", preset.epsilon, tau_sigmas=t, sigma_ratio=preset.sigma_ratios[0])
          for t in preset.tau_sigmas}
  assert ({default_point(a, preset.epsilon, preset) for a in preset.epsilon_algorithms}
          <= tradeoff)
  assert preset.epsilon in preset.epsilons
  assert default_point("adafest", preset.epsilon, preset) in heat


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
  coarse = [{**report_point("dpsgd", 0.70, 1.0), "flags": ()}] + [
      {**report_point("adafest", auc, reduction, f"adafest tau={t:g}s s1/s2=5"), "flags": (),
       "tau_sigmas": t, "sigma_ratio": 5.0}
      for t, auc, reduction in ((2.0, 0.699, 100.0), (8.0, 0.68, 10_000.0))]
  (refined,) = refined_points(coarse, PAPER)
  assert refined == Point("adafest", PAPER.epsilon, tau_sigmas=4.0, sigma_ratio=5.0)
  # Along a sweep of the absolute tau (C1 = 5 alone on its own sweep: nothing to bracket).
  absolute = [{**report_point("adafest", auc, reduction, f"adafest tau={t} {c}"),
               "sigma_ratio": 5.0,
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
