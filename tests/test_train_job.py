"""``sparse-dp train`` runs end to end on synthetic Criteo files and reports what it spent."""

import json
import re

import numpy as np
import pytest

from conftest import one_stack
from sparse_dp.accounting.report import NOT_POISSON
from sparse_dp.cli import main
from sparse_dp.data import training_examples
from sparse_dp.data.synthetic import SyntheticCriteo
from sparse_dp.models import pctr_data, train_job
from sparse_dp.models.calibration import base_rate_log_loss

KEYS = {"algorithm", "auc", "logloss", "base_rate_logloss", "ece", "epsilon", "delta", "steps",
        "examples_per_second", "gradient_size_reduction", "nonzero_rows_per_step",
        "nonzero_rows_per_step_min", "nonzero_rows_per_step_max", "nonzero_coordinates_per_step",
        "train_examples", "eval_examples", "skipped_lines"}


@pytest.mark.parametrize("algorithm", ["none", "adafest"])
def test_train_writes_model_vocabulary_metrics_and_plot(tmp_path, capsys, algorithm):
  out = tmp_path / algorithm
  assert main(["train", "--algorithm", algorithm, "--max-examples", "3000", "--batch-size", "256",
               "--out", str(out), "--noise-seed", "1", "--json"]) == 0
  metrics = json.loads(capsys.readouterr().out)  # stdout: one JSON object
  assert KEYS <= set(metrics) and metrics["algorithm"] == algorithm
  assert metrics["train_examples"] == 2700 and metrics["eval_examples"] == 300
  assert 0.0 <= metrics["auc"] <= 1.0 and metrics["logloss"] > 0
  assert json.loads((out / "metrics.json").read_text()) == metrics
  for name in ("vocabulary.json", "training.png", "reliability.png", "model/saved_model.pb"):
    assert (out / name).exists(), name
  # Calibration of the held-out predictions, against the held-out base rate.
  split = pctr_data.CriteoSplit.read([out / "synthetic_day_1.gz"], 3000, "error")
  assert metrics["observed_rate"] == pytest.approx(split.held_out["label"].mean())
  assert metrics["base_rate_logloss"] == pytest.approx(base_rate_log_loss(split.held_out["label"]))
  assert 0 <= metrics["ece"] <= 1 and metrics["ece_bins"] == 10
  # The training examples by content (what distill --teacher refuses as public data).
  assert metrics["noise_seed"] == 1
  assert np.array_equal(training_examples.load(out),
                        np.unique(training_examples.feature_hashes(split.train)))
  assert len(training_examples.load(out)) == 2700
  if algorithm == "adafest":
    assert 0 < metrics["epsilon"] <= 1.0 and metrics["gradient_size_reduction"] > 1


@one_stack("tf2.15")
def test_compare_trains_each_algorithm_on_the_same_split(tmp_path, capsys):
  out = tmp_path / "compare"
  assert main(["train", "--compare", "none,fest,adafest+", "--max-examples", "2500",
               "--batch-size", "256", "--hidden-units", "32", "--fest-k", "40",
               "--out", str(out), "--json"]) == 0
  captured = capsys.readouterr()
  results = json.loads(captured.out)["results"]  # stdout: one JSON object
  assert [r["algorithm"] for r in results] == ["none", "fest", "adafest+"]
  # The epsilon Keras logs during training includes the preselection's (charged in the record).
  logged = [float(e) for e in re.findall(r" - epsilon: ([0-9.]+)", captured.err)]
  assert logged == pytest.approx([r["epsilon"] for r in results[1:]], rel=1e-3)
  assert all(KEYS <= set(r) for r in results)
  assert len({(r["train_examples"], r["eval_examples"]) for r in results}) == 1
  assert json.loads((out / "compare.json").read_text())["results"] == results
  table = (out / "compare.md").read_text().splitlines()
  assert table[0].startswith("| algorithm | auc") and len(table) == 2 + len(results)
  assert (out / "compare.png").stat().st_size > 0
  for result in results[1:]:
    # The top-k's share and the training compose to at most the target epsilon.
    assert result["selection_epsilon"] == pytest.approx(0.1)
    assert 0.9 < result["epsilon"] <= 1.0 + 1e-9
    assert result["gradient_size_reduction"] > 1
    kept = json.loads((out / result["algorithm"] / "preselection.json").read_text())
    assert max(len(k) for k in kept["kept_buckets"] if k is not None) == 40


def test_a_private_run_refuses_a_vocabulary_counted_on_its_data(tmp_path, capsys):
  assert main(["train", "--algorithm", "dpsgd", "--vocabulary", "counted",
               "--max-examples", "100", "--out", str(tmp_path)]) == 2
  assert "--vocabulary counted counts the private training data" in capsys.readouterr().err


def test_train_reports_bad_lines_or_skips_and_counts_them(tmp_path, capsys):
  data = tmp_path / "day_0"
  data.write_text("1\t2\n")
  assert main(["train", "--data", str(data), "--out", str(tmp_path / "o")]) == 2
  assert "day_0:1: expected 40 tab-separated fields" in capsys.readouterr().err
  lines = list(SyntheticCriteo(scale=0.01).lines(1, 200))
  lines.insert(7, "1\t2")
  data.write_text("\n".join(lines) + "\n")
  assert main(["train", "--data", str(data), "--algorithm", "none", "--vocabulary", "counted",
               "--hidden-units", "8", "--on-bad-line", "skip", "--out", str(tmp_path / "o"),
               "--json"]) == 0
  metrics = json.loads(capsys.readouterr().out)  # stdout: one JSON object
  assert metrics["skipped_lines"] == 1 and metrics["train_examples"] + metrics["eval_examples"] == 200


@one_stack("tf2.21")
def test_tfdata_reader_streams_training_files_and_evaluates_on_others(tmp_path, capsys):
  synthetic = SyntheticCriteo(scale=0.01, seed=5)
  train_days = [synthetic.write_day(tmp_path / f"day_{d}.gz", d, 1200) for d in (1, 2)]
  held_out = synthetic.write_day(tmp_path / "day_3", 3, 500)
  common = ["train", "--reader", "tfdata", "--data", str(tmp_path / "day_[12].gz"),
            "--max-examples", "0", "--batch-size", "256", "--hidden-units", "16"]
  assert main([*common, "--out", str(tmp_path / "o")]) == 2
  assert "--eval-data" in capsys.readouterr().err
  assert main([*common, "--eval-data", str(held_out), "--algorithm", "fest", "--fest-k", "30",
               "--out", str(tmp_path / "o"), "--json"]) == 0
  metrics = json.loads(capsys.readouterr().out)  # stdout: one JSON object
  assert metrics["train_examples"] == 2400 and metrics["eval_examples"] == 500
  assert metrics["poisson_sampling"] is False and 0.9 < metrics["epsilon"] <= 1.0 + 1e-9
  assert metrics["privacy_caveat"] == NOT_POISSON  # in the line of the JSON epsilon
  assert NOT_POISSON in train_job._with_caveat("epsilon", metrics["epsilon"], metrics)
  assert NOT_POISSON in train_job._markdown_table([metrics]).splitlines()[-1]
  assert metrics["gradient_size_reduction"] > 1 and len(train_days) == 2
  lines = held_out.read_text().splitlines()
  lines[41] = "0\tx" + lines[41][1:]
  held_out.write_text("\n".join(lines) + "\n")
  assert main([*common, "--eval-data", str(held_out), "--out", str(tmp_path / "o")]) == 2
  assert "day_3:42: expected 40 tab-separated fields" in capsys.readouterr().err
