"""``sparse-dp stream``: periods under one budget, refusal, and resume after SIGKILL
(the killed job's lock does not block the rerun)."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sparse_dp.cli import build_parser, main
from sparse_dp.data.synthetic import SyntheticCriteo
from sparse_dp.jobs.stream import stream_job
from sparse_dp.jobs.stream.stream_job import parse_days
from sparse_dp.jobs.stream.stream_periods import StreamData
from sparse_dp.jobs.stream.stream_state import StreamState
from sparse_dp.jobs.study.presets import FULL, SMOKE

from support.stacks import one_stack

# A small stream: 2 one-day periods of 1,500 examples, two tables at 5% of Table 3.
SMALL = ["--categorical-features", "2", "--train-days", "1-2", "--eval-days", "3",
         "--examples-per-day", "1500",
         "--eval-examples-per-day", "800", "--synthetic-scale", "0.05", "--hidden-units", "32",
         "--batch-size", "256", "--fest-k", "50", "--algorithm", "adafest+", "--total-epsilon", "2"]


def spends(state):
  lines = (state / "ledger.jsonl").read_text().splitlines()
  return [(e["period"], e["kind"], e["epsilon"]) for e in map(json.loads, lines)]


@pytest.mark.slow
@one_stack("tf2.15")  # the TF 2.21 stack ran 477 s longer in CI (pytest.ini's durations)
def test_stream_runs_every_period_then_refuses_a_job_past_the_budget(tmp_path, capsys):
  state = tmp_path / "state"
  assert main(["stream", *SMALL, "--state", str(state), "--json"]) == 0
  summary = json.loads(capsys.readouterr().out)  # stdout: one JSON object
  assert [p["period"] for p in summary["periods"]] == [1, 2]
  assert summary["epsilon_total"] == 2 and summary["epsilon_spent"] == pytest.approx(2)
  assert summary["ledger"] == str(state / "ledger.jsonl")
  # Running selection: a selection and a training spend per period, in order.
  assert [(p, k) for p, k, _ in spends(state)] == [(1, "selection"), (1, "training"),
                                                   (2, "selection"), (2, "training")]
  for period in summary["periods"]:
    assert 0 <= period["auc"] <= 1 and period["gradient_size_reduction"] > 1
    assert (state / "periods" / str(period["period"]) / "model" / "saved_model.pb").exists()
  assert [p["epsilon_spent"] for p in summary["periods"]] == pytest.approx([1, 2])
  assert (state / "stream.png").stat().st_size > 0
  # The same job again needs budget that is spent: refused, ledger untouched.
  before = (state / "ledger.jsonl").read_bytes()
  assert main(["stream", *SMALL, "--state", str(state), "--json"]) == 2
  error = capsys.readouterr().err
  assert "only 0 of the total epsilon 2 remains" in error and "ledger.jsonl" in error
  assert (state / "ledger.jsonl").read_bytes() == before
  assert main(["stream", *SMALL[:-2], "--total-epsilon", "3", "--state", str(state)]) == 2
  assert "cannot change" in capsys.readouterr().err
  # Dropping the earlier periods' models keeps their metrics and the last model.
  StreamState.open(state, None, 0.0).drop_earlier_models()
  assert not (state / "periods" / "1" / "model").exists()
  assert not (state / "periods" / "1" / "weights.npz").exists()
  assert (state / "periods" / "1" / "metrics.json").exists()
  assert (state / "periods" / "2" / "model" / "saved_model.pb").exists()
  assert (state / "periods" / "2" / "weights.npz").exists()


@pytest.mark.slow
@one_stack("tf2.15")
def test_sigkill_then_rerun_records_the_spends_of_an_uninterrupted_run(tmp_path, capsys):
  flags = [*SMALL, "--fest-frequencies", "first-day"]
  killed = tmp_path / "killed"
  command = [sys.executable, "-m", "sparse_dp.cli", "stream", *flags, "--state", str(killed)]
  job = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         cwd=tmp_path, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
  deadline = time.time() + 400
  # Kill in the middle of period 2: its spend is recorded, its model not yet published.
  while time.time() < deadline and job.poll() is None:
    ledger = killed / "ledger.jsonl"
    if ledger.exists() and (2, "training") in [(p, k) for p, k, _ in spends(killed)]:
      break
    time.sleep(0.05)
  assert job.poll() is None, "the job ended before it could be killed"
  job.send_signal(signal.SIGKILL)
  job.wait()
  assert not (killed / "periods" / "2").exists()
  # The killed job's record stays in the lock file; its lock went with it.
  assert json.loads((killed / "stream.lock").read_text())["pid"] == job.pid
  # The unfinished job resumes only with its own settings.
  assert main(["stream", *flags, "--learning-rate", "0.01", "--state", str(killed)]) == 2
  assert ("unfinished job with other settings (learning_rate 0.003, now 0.01)"
          in capsys.readouterr().err)
  assert main(["stream", *flags, "--state", str(killed)]) == 0
  # An uninterrupted run's spends (its plan): epsilon 1 a period, the first day's
  # top-k taking --selection-share 0.1 of period 1's. Period 2 is not charged twice.
  assert spends(killed) == [(1, "selection", pytest.approx(0.1)),
                            (1, "training", pytest.approx(0.9)),
                            (2, "training", pytest.approx(1.0))]
  assert sorted(os.listdir(killed / "periods")) == ["1", "2"]


def test_an_unfinished_job_refuses_to_resume_with_another_optimizer(tmp_path, capsys):
  state = tmp_path / "state"
  args = build_parser().parse_args(["stream", *SMALL, "--state", str(state)])
  record = stream_job._settings_record(args, [1, 2], [3])
  assert record["optimizer"] == "adam"
  StreamState.open(state, 2.0, 1e-4).start_job(record, [[1], [2]], [True, True], 0.1, None)
  assert main(["stream", *SMALL, "--optimizer", "rowwise-adagrad", "--state", str(state)]) == 2
  assert ("unfinished job with other settings (optimizer 'adam', now 'rowwise-adagrad')"
          in capsys.readouterr().err)
  assert not (state / "periods").exists()
  # An unfinished job's models are kept: its next period warm-starts from the last one.
  with pytest.raises(ValueError, match=r"unfinished job \(periods 1-2\)"):
    StreamState.open(state, None, 0.0).drop_earlier_models()
  # A job recorded before --optimizer existed trained with Adam: resumed with it, not refused.
  older = tmp_path / "older"
  StreamState.open(older, 2.0, 1e-4).start_job(
      {k: v for k, v in record.items() if k not in ("optimizer", "embedding_dim")},
      [[1], [2]], [True, True], 0.1, None)
  assert main(["stream", *SMALL, "--optimizer", "sgd", "--state", str(older)]) == 2
  assert "other settings (optimizer 'adam', now 'sgd')" in capsys.readouterr().err
  assert stream_job._settings_record(args, [1, 2], [3]) == {
      **stream_job._SETTINGS_BEFORE_RECORDED,
      **{k: v for k, v in record.items() if k not in ("optimizer", "embedding_dim")}}


def test_bad_flags_and_a_changed_unfinished_job_are_refused(tmp_path, capsys):
  assert parse_days("1-3,7", "--train-days") == [1, 2, 3, 7]
  for text in ("3-1", "a", "1,1"):
    with pytest.raises(ValueError, match="--train-days"):
      parse_days(text, "--train-days")
  assert main(["stream", "--train-days", "1-3", "--eval-days", "3",
               "--state", str(tmp_path / "s")]) == 2
  assert "share days [3]" in capsys.readouterr().err
  assert main(["stream", "--train-days", "20-30", "--eval-days", "1", "--state",
               str(tmp_path / "s")]) == 2
  assert "not among the synthetic data's days 0..23" in capsys.readouterr().err
  assert not (tmp_path / "s" / "ledger.jsonl").exists()


@pytest.mark.slow
@one_stack("tf2.21")
def test_stream_reads_criteo_day_files(tmp_path, capsys):
  synthetic = SyntheticCriteo(scale=0.05, seed=2)
  for day in (0, 1, 2):
    synthetic.write_day(tmp_path / f"day_{day}.gz", day + 1, 600)
  state = tmp_path / "state"
  # One period of both training days: two files read, one model trained.
  assert main(["stream", "--categorical-features", "2", "--data", str(tmp_path / "day_*.gz"),
               "--train-days", "0-1",
               "--streaming-period", "2", "--eval-days", "2", "--algorithm", "dpsgd",
               "--hidden-units", "16", "--batch-size", "128", "--state", str(state),
               "--json"]) == 0
  summary = json.loads(capsys.readouterr().out)
  assert [p["days"] for p in summary["periods"]] == [[0, 1]]
  assert [p["train_examples"] for p in summary["periods"]] == [1200]
  assert summary["periods"][0]["eval_examples"] == 600
  assert main(["stream", "--data", str(tmp_path / "day_*.gz"), "--train-days", "3",
               "--eval-days", "2", "--state", str(tmp_path / "other")]) == 2
  assert "days [3] are not among the files of --data (days [0, 1, 2])" in capsys.readouterr().err


def test_synthetic_days_are_numbered_as_the_criteo_1tb_files(tmp_path, capsys):
  commands = argparse.ArgumentParser().add_subparsers()
  stream_job.add_parser(commands)
  args = commands.choices["stream"].parse_args(["--examples-per-day", "20", "--synthetic-scale",
                                                "0.01", "--state", str(tmp_path)])
  assert (parse_days(args.train_days, "--train-days") + parse_days(args.eval_days, "")
          == list(range(24)))
  synthetic = SyntheticCriteo(scale=0.01)
  assert [len(synthetic.examples(day, 5)["labels"]) for day in (0, 23)] == [5, 5]
  with pytest.raises(ValueError, match=r"day_0\.\.day_23"):
    synthetic.examples(24, 5)
  assert len(StreamData(args, tmp_path).frame([0], 20)) == 20
  assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["day_0.gz"]
  assert main(["stream", "--train-days", "0", "--eval-days", "24", "--state",
               str(tmp_path / "s")]) == 2
  assert "days [24] are not among the synthetic data's days 0..23" in capsys.readouterr().err
  assert SMOKE.stream_train_days == "0" and FULL.stream_train_days == "0-1"
