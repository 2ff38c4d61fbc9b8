"""``sparse-dp train`` runs end to end on synthetic Criteo files and reports what it spent."""

import json

import pytest

from sparse_dp.cli import main

KEYS = {"algorithm", "auc", "logloss", "epsilon", "delta", "steps", "examples_per_second",
        "gradient_size_reduction", "nonzero_rows_per_step", "train_examples",
        "eval_examples", "skipped_lines"}


@pytest.mark.parametrize("algorithm", ["none", "adafest"])
def test_train_writes_model_vocabulary_metrics_and_plot(tmp_path, capsys, algorithm):
  out = tmp_path / algorithm
  assert main(["train", "--algorithm", algorithm, "--max-examples", "3000", "--batch-size", "256",
               "--out", str(out), "--noise-seed", "1", "--json"]) == 0
  metrics = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert KEYS <= set(metrics) and metrics["algorithm"] == algorithm
  assert metrics["train_examples"] == 2700 and metrics["eval_examples"] == 300
  assert 0.0 <= metrics["auc"] <= 1.0 and metrics["logloss"] > 0
  assert json.loads((out / "metrics.json").read_text()) == metrics
  for name in ("vocabulary.json", "training.png", "model/saved_model.pb"):
    assert (out / name).exists(), name
  if algorithm == "adafest":
    assert 0 < metrics["epsilon"] <= 1.0 and metrics["gradient_size_reduction"] > 1


def test_train_reports_bad_lines(tmp_path, capsys):
  data = tmp_path / "day_0"
  data.write_text("1\t2\n")
  assert main(["train", "--data", str(data), "--out", str(tmp_path / "o")]) == 2
  assert "day_0:1: expected 40 tab-separated fields" in capsys.readouterr().err
