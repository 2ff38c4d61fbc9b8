"""``sparse-dp train`` runs end to end on synthetic Criteo files and reports what it spent."""

import gzip
import json
import re

import numpy as np
import pytest

from sparse_dp import keras
from sparse_dp.accounting.report import NOT_POISSON
from sparse_dp.cli import build_parser, main
from sparse_dp.data import training_examples
from sparse_dp.data.criteo_format import TABLE3_VOCABULARY_SIZES
from sparse_dp.data.synthetic import SyntheticCriteo
from sparse_dp.jobs.train import train_job
from sparse_dp.models import pctr_data
from sparse_dp.models.calibration import base_rate_log_loss
from sparse_dp.optimizers import RowwiseAdagrad

from support.stacks import one_stack

KEYS = {"algorithm", "auc", "logloss", "base_rate_logloss", "ece", "epsilon", "delta", "steps",
        "examples_per_second", "gradient_size_reduction", "nonzero_rows_per_step",
        "nonzero_rows_per_step_min", "nonzero_rows_per_step_max", "nonzero_coordinates_per_step",
        "train_examples", "eval_examples", "skipped_lines", "first_step_seconds",
        "examples_per_second_after_first_step"}


# The private run on one stack (CI time): the other trains adafest through this job
# in test_tpu_embedding_backend.py::test_train_cli_auto_says_it_trains_with_cpu_off_tpu.
@pytest.mark.slow
@pytest.mark.parametrize("algorithm", [
    "none", pytest.param("adafest", marks=one_stack("tf2.15"))])
def test_train_writes_model_vocabulary_metrics_and_plot(tmp_path, capsys, algorithm):
  out, keys = tmp_path / algorithm, tmp_path / "keys"
  assert main(["train", "--algorithm", algorithm, "--categorical-features", "3",
               "--max-examples", "3000", "--batch-size", "256", "--secrets-dir", str(keys),
               "--hidden-units", "8", "--out", str(out), "--noise-seed", "1", "--json"]) == 0
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
  # The training examples by content (what distill --teacher refuses as public data), keyed
  # with a key written outside --out: no unkeyed hash of an example is in the folder.
  assert metrics["noise_seed"] == 1
  record = training_examples.load(out, keys)
  assert len(record.hashes) == 2700 and record.count_in(split.train) == 2700
  assert not (out / training_examples.LEGACY_FILE).exists()
  assert not np.isin(training_examples.feature_hashes(split.train), record.hashes).any()
  if algorithm == "adafest":
    assert 0 < metrics["epsilon"] <= 1.0 and metrics["gradient_size_reduction"] > 1
    # Calibrated by default: 0.05 of the epsilon on a private Platt scaling, in the total.
    assert metrics["calibration_share"] == 0.05 and 0 < metrics["calibration_epsilon"] < 0.2
  else:
    assert metrics["calibration_share"] == 0.0


@pytest.mark.slow
@one_stack("tf2.15")
def test_compare_trains_each_algorithm_on_the_same_split(tmp_path, capsys):
  out = tmp_path / "compare"
  # fest trains through this job in test_tfdata_reader_... (and its step in test_xla.py):
  # one algorithm without and one with a top-k preselection cover what --compare does.
  # Uncalibrated (--calibration-share 0): the epsilon Keras logs is then the run's whole
  # (tests/unit/mechanisms/test_platt_scaling.py covers the calibration's share).
  assert main(["train", "--compare", "none,adafest+", "--categorical-features", "2",
               "--max-examples", "2500",
               "--batch-size", "256", "--hidden-units", "32", "--fest-k", "40",
               "--calibration-share", "0", "--out", str(out), "--json"]) == 0
  captured = capsys.readouterr()
  results = json.loads(captured.out)["results"]  # stdout: one JSON object
  assert [r["algorithm"] for r in results] == ["none", "adafest+"]
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


@pytest.mark.slow
def test_train_takes_an_optimizer_a_vocabulary_scale_and_an_embedding_dim(tmp_path, capsys):
  out = tmp_path / "run"
  # Non-private: the DP steps with RowwiseAdagrad are tests/unit/training/test_rowwise_adagrad.py's.
  assert main(["train", "--algorithm", "none", "--optimizer", "rowwise-adagrad",
               "--categorical-features", "2",
               "--learning-rate", "0.03", "--vocabulary-scale", "0.02", "--embedding-dim", "4",
               "--hidden-units", "8", "--max-examples", "600", "--batch-size", "128",
               "--out", str(out), "--json"]) == 0
  metrics = json.loads(capsys.readouterr().out)
  assert (metrics["optimizer"], metrics["learning_rate"]) == ("rowwise-adagrad", 0.03)
  assert metrics["vocabulary_scale"] == 0.02
  sizes = pctr_data.hashed_vocabulary(0.02).sizes[:2]  # the first two features' tables
  assert metrics["table_rows"] == sum(sizes) < sum(TABLE3_VOCABULARY_SIZES) / 10
  model = keras.models.load_model(out / "model")
  assert isinstance(model.optimizer, RowwiseAdagrad)
  assert model.optimizer.get_config()["learning_rate"] == pytest.approx(0.03)
  tables = sorted(tuple(w.shape) for w in model.weights if "embeddings" in w.name)
  assert tables == sorted((size, 4) for size in sizes)


def test_vocabulary_scale_1_is_the_default_job_s_data(tmp_path):
  args = build_parser().parse_args(["train", "--max-examples", "50"])
  assert args.vocabulary_scale == 1.0
  (path,), scale = train_job._data_paths(args, tmp_path)
  default = SyntheticCriteo(seed=0).write_day(tmp_path / "default.gz", 1, 50)
  assert scale == 1.0 and gzip.open(path).read() == gzip.open(default).read()


@pytest.mark.parametrize("flags,message", [
    (["--vocabulary-scale", "0"], "--vocabulary-scale must be > 0"),
    (["--vocabulary-scale", "2", "--vocabulary", "counted", "--algorithm", "none"],
     "--vocabulary-scale 2 sizes hashed tables"),
    (["--embedding-dim", "0"], "--embedding-dim must be a positive integer"),
    (["--learning-rate", "0"], "--learning-rate must be > 0"),
])
def test_bad_scale_dimension_and_learning_rate_are_refused_naming_the_flag(
    tmp_path, capsys, flags, message):
  assert main(["train", *flags, "--max-examples", "100", "--batch-size", "64",
               "--out", str(tmp_path)]) == 2
  assert message in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [
    (["--epsilon", "-1"], "--epsilon must be a finite number > 0, got -1.0"),
    (["--epsilon", "nan"], "--epsilon must be a finite number > 0, got nan"),
    (["--epochs", "0"], "--epochs must be a finite number > 0, got 0.0"),
    (["--l2-norm-clip", "-2"], "--l2-norm-clip must be a finite number > 0"),
    (["--delta", "1"], "--delta must be in (0, 1)"),
    (["--fest-k", "0"], "--fest-k must be an integer >= 1"),
    (["--batch-size", "91"], "--batch-size 91 is more than the 90 training examples"),
    (["--dense-tables", "embedding_0,"], "--dense-tables must be none, auto or layer names"),
    (["--light-users", "1"], "--light-users must be in [0, 1), got 1.0"),
    (["--algorithm", "adafest+", "--dense-tables", "auto"],
     "dense_tables='auto' makes all 26 tables of the model dense"),
    (["--light-users", "0.5", "--data", "days/*.gz"], "--light-users shapes the synthetic data"),
    (["--dense-tables", "users"], "--dense-tables names users, not a table of the pCTR model: "
                                  "its tables are embedding_0 ... embedding_25"),
])
def test_bad_flags_are_refused_before_any_data_is_drawn_or_written(tmp_path, capsys, flags,
                                                                   message):
  out = tmp_path / "out"
  assert main(["train", *flags, "--max-examples", "100", "--out", str(out)]) == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and message in error[0]
  assert not out.exists()


def test_an_out_folder_that_holds_anything_is_refused_and_kept(tmp_path, capsys):
  out = tmp_path / "out"
  out.mkdir()
  (out / "mine.txt").write_text("the user's")
  assert main(["train", "--max-examples", "100", "--batch-size", "64", "--out", str(out)]) == 2
  assert "already holds mine.txt" in capsys.readouterr().err
  assert main(["train", "--max-examples", "100", "--batch-size", "64", "--out", str(out),
               "--overwrite"]) == 2
  assert "which no sparse-dp run wrote" in capsys.readouterr().err
  assert sorted(p.name for p in out.iterdir()) == ["mine.txt"]


@pytest.mark.parametrize("lines,message", [
    ([], "no lines to read (an empty file)"),
    (["1\t2", "x"], "every one of the 2 lines read is malformed and was skipped"),
])
def test_a_file_without_a_valid_example_is_refused_saying_why(tmp_path, capsys, lines, message):
  data = tmp_path / "day_0"
  data.write_text("".join(line + "\n" for line in lines))
  assert main(["train", "--data", str(data), "--on-bad-line", "skip",
               "--out", str(tmp_path / "o")]) == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and message in error[0] and str(data) in error[0]


def test_a_private_run_refuses_a_vocabulary_counted_on_its_data(tmp_path, capsys):
  assert main(["train", "--algorithm", "dpsgd", "--vocabulary", "counted",
               "--max-examples", "100", "--batch-size", "64", "--out", str(tmp_path)]) == 2
  assert "--vocabulary counted counts the private training data" in capsys.readouterr().err


@pytest.mark.slow
def test_train_reports_bad_lines_or_skips_and_counts_them(tmp_path, capsys):
  data = tmp_path / "day_0"
  data.write_text("1\t2\n")
  assert main(["train", "--data", str(data), "--out", str(tmp_path / "o")]) == 2
  assert "day_0:1: expected 40 tab-separated fields" in capsys.readouterr().err
  lines = list(SyntheticCriteo(scale=0.01).lines(1, 200))
  lines.insert(7, "1\t2")
  data.write_text("\n".join(lines) + "\n")
  assert main(["train", "--data", str(data), "--algorithm", "none", "--vocabulary", "counted",
               "--categorical-features", "2", "--batch-size", "64",
               "--hidden-units", "8", "--on-bad-line", "skip", "--out", str(tmp_path / "o"),
               "--json"]) == 0
  metrics = json.loads(capsys.readouterr().out)  # stdout: one JSON object
  assert (metrics["skipped_lines"] == 1
          and metrics["train_examples"] + metrics["eval_examples"] == 200)


@pytest.mark.slow
@one_stack("tf2.15")  # CI's tf2.21 stack is the longer
def test_tfdata_reader_streams_training_files_and_evaluates_on_others(tmp_path, capsys):
  synthetic = SyntheticCriteo(scale=0.01, seed=5)
  train_days = [synthetic.write_day(tmp_path / f"day_{d}.gz", d, 1200) for d in (1, 2)]
  held_out = synthetic.write_day(tmp_path / "day_3", 3, 500)
  common = ["train", "--reader", "tfdata", "--categorical-features", "3",
            "--data", str(tmp_path / "day_[12].gz"),
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
  assert "already holds" in capsys.readouterr().err  # the run's outputs: --overwrite clears
  assert main([*common, "--eval-data", str(held_out), "--out", str(tmp_path / "o"),
               "--overwrite"]) == 2
  assert "day_3:42: expected 40 tab-separated fields" in capsys.readouterr().err


def test_a_vocabulary_scale_beyond_this_machines_memory_is_refused_before_any_data(
    tmp_path, capsys, monkeypatch):
  """At 100x Table 3 the tables are 11.5 GiB: Adam's two slots cannot fit 24 GiB, row-wise
  Adagrad's one float per row can (DP-SGD's chunked noise too). Refused in one line naming
  the flags, before synthetic data is written."""
  from sparse_dp.jobs.train import memory
  monkeypatch.setattr(memory, "memory_limit_bytes", lambda: 24 * memory.GIB)
  out = tmp_path / "run"
  assert main(["train", "--vocabulary-scale", "100", "--out", str(out)]) == 2
  error = capsys.readouterr().err.strip().splitlines()
  assert len(error) == 1 and "--vocabulary-scale 100 with --optimizer adam" in error[0]
  assert "adam's 2 table-sized slots" in error[0] and "--optimizer rowwise-adagrad" in error[0]
  assert not any(out.rglob("*.txt"))  # no synthetic day written
  from sparse_dp.jobs.train.job_flags import fit_settings
  from sparse_dp.jobs.train.train_job import check_memory
  for algorithm in ("none", "adafest", "dpsgd"):
    args = build_parser().parse_args(["train", "--vocabulary-scale", "100", "--optimizer",
                                      "rowwise-adagrad", "--algorithm", algorithm])
    check_memory(args, [algorithm], fit_settings(args, epsilon=args.epsilon))
  args = build_parser().parse_args(["train", "--vocabulary-scale", "100", "--embedding-dim",
                                    "300", "--optimizer", "sgd"])
  with pytest.raises(ValueError, match="--embedding-dim"):
    check_memory(args, ["adafest"], fit_settings(args, epsilon=args.epsilon))
