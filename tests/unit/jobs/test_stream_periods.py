"""The stream's period loop with a stub trainer: the ledger, a crash, its resume, budget and lock.

The fast proof of what ``tests/e2e/test_stream_job.py`` shows end to end: a
period's spend is recorded before its model is published, a resumed job charges
nothing twice, a job past the budget is refused with the ledger untouched, and two
jobs on one state spend its budget once (tests/e2e/test_stream_lock.py runs them as
processes).
The trainer is replaced by one that fits nothing (the privacy of a period's fit
is the DP step's, proved in tests/unit/training); everything else is the job's.
"""

import json
import os
import threading
import types

import pytest

from sparse_dp import keras
from sparse_dp.cli import build_parser
from sparse_dp.jobs.stream import stream_job
from sparse_dp.jobs.stream.stream_lock import LOCK_FILE, StateLock, StateLockedError
from sparse_dp.jobs.train import fitting

FLAGS = ["--train-days", "1-2", "--eval-days", "3", "--examples-per-day", "300",
         "--eval-examples-per-day", "100", "--synthetic-scale", "0.01", "--hidden-units", "4",
         "--batch-size", "64", "--fest-k", "20", "--algorithm", "adafest+", "--total-epsilon", "2",
         "--fest-frequencies", "first-day"]


class StubTrainer:
  """Stands in for ``fitting.fit_and_evaluate``: a one-weight model, no training.

  ``crash_at``: the call (1-based) that raises, as a job killed in its fit.
  """

  def __init__(self, crash_at=None):
    self.calls, self.crash_at = [], crash_at

  def __call__(self, algorithm, settings, train, held_out, sizes, preselection=None,
               initial_weights=None):
    self.calls.append({"epsilon": settings.epsilon, "warm": initial_weights is not None,
                       "noise_seed": settings.noise_seed})
    if len(self.calls) == self.crash_at:
      raise KeyboardInterrupt("killed in the middle of the period's fit")
    inputs = keras.Input(shape=(1,))
    model = keras.Model(inputs, keras.layers.Dense(1, name="logit")(inputs))
    if initial_weights is not None:
      initial_weights(model)
    return types.SimpleNamespace(model=model, metrics={"auc": 0.5,
                                                       "gradient_size_reduction": 2.0})


def run(state, monkeypatch, trainer, *extra):
  monkeypatch.setattr(fitting, "fit_and_evaluate", trainer)
  args = build_parser().parse_args(["stream", *FLAGS, *extra, "--state", str(state)])
  return stream_job.stream(args)


def spends(state):
  lines = (state / "ledger.jsonl").read_text().splitlines()
  return [(e["period"], e["kind"], e["epsilon"]) for e in map(json.loads, lines)]


def test_a_crashed_period_resumes_with_the_spends_of_an_uninterrupted_run(tmp_path, monkeypatch):
  whole = tmp_path / "whole"
  summary = run(whole, monkeypatch, StubTrainer())
  assert [p["epsilon_spent"] for p in summary["periods"]] == pytest.approx([1, 2])
  # The first day's top-k takes --selection-share 0.1 of period 1's epsilon.
  assert spends(whole) == [(1, "selection", pytest.approx(0.1)),
                           (1, "training", pytest.approx(0.9)),
                           (2, "training", pytest.approx(1.0))]
  crashed, killed = tmp_path / "crashed", StubTrainer(crash_at=2)
  with pytest.raises(KeyboardInterrupt):
    run(crashed, monkeypatch, killed)
  # Period 2's spend is recorded before its fit; its model is not published.
  assert spends(crashed) == spends(whole)
  assert not (crashed / "periods" / "2").exists()
  assert (crashed / "periods" / "1" / "metrics.json").exists()
  # The rerun trains period 2 only, warm-started from period 1, and charges nothing again.
  resumed = StubTrainer()
  summary = run(crashed, monkeypatch, resumed)
  # The rerun draws the crashed attempt's noise (its seed is the state's, per period).
  assert resumed.calls == [{"epsilon": pytest.approx(1.0), "warm": True,
                            "noise_seed": killed.calls[1]["noise_seed"]}]
  assert spends(crashed) == spends(whole)
  assert [p["epsilon_spent"] for p in summary["periods"]] == pytest.approx([1, 2])


def test_a_job_past_the_budget_or_with_other_settings_is_refused_and_spends_nothing(
    tmp_path, monkeypatch):
  state = tmp_path / "state"
  run(state, monkeypatch, StubTrainer())
  before = (state / "ledger.jsonl").read_bytes()
  trainer = StubTrainer()
  with pytest.raises(ValueError, match="only 0 of the total epsilon 2 remains"):
    run(state, monkeypatch, trainer)
  crashed = tmp_path / "crashed"
  with pytest.raises(KeyboardInterrupt):
    run(crashed, monkeypatch, StubTrainer(crash_at=1))
  with pytest.raises(ValueError, match=r"other settings \(learning_rate 0.003, now 0.01\)"):
    run(crashed, monkeypatch, trainer, "--learning-rate", "0.01")
  with pytest.raises(ValueError, match=r"other settings \(categorical_features None, now 2\)"):
    run(crashed, monkeypatch, trainer, "--categorical-features", "2")
  # A job begun at the threshold's and ratio's defaults before their rule: the fix is named.
  before_rule = tmp_path / "before_rule"
  with pytest.raises(KeyboardInterrupt):
    run(before_rule, monkeypatch, StubTrainer(crash_at=1), "--sigma-ratio", "2",
        "--tau-sigmas", "4")
  with pytest.raises(ValueError, match=r"\(sigma_ratio 2.0, now None; tau_sigmas 4.0, now "
                                       r"None\).* ran with --sigma-ratio 2 --tau-sigmas 4"):
    run(before_rule, monkeypatch, trainer)
  # A new job on a finished state whose model its weights cannot warm-start: refused.
  with pytest.raises(ValueError, match=r"other categorical_features; a new job warm-starts"):
    run(state, monkeypatch, trainer, "--categorical-features", "2")
  assert trainer.calls == []
  assert (state / "ledger.jsonl").read_bytes() == before


def test_a_locked_state_refuses_a_job_before_any_spend(tmp_path, monkeypatch):
  state = tmp_path / "state"
  with StateLock(state):
    with pytest.raises(StateLockedError, match=rf"pid {os.getpid()} on host"):
      run(state, monkeypatch, StubTrainer())
  assert not (state / "ledger.jsonl").exists()
  assert (state / LOCK_FILE).read_text() == ""  # a released lock names no holder


def test_two_jobs_started_at_once_spend_the_budget_once(tmp_path, monkeypatch):
  """Each job waits for the lock (``flock`` on the lock file excludes two opens, threads
  too): the first spends the budget, the second then finds it spent."""
  state, outcomes = tmp_path / "state", []

  def job():
    try:
      outcomes.append(run(state, monkeypatch, StubTrainer(), "--wait-for-lock", "120"))
    except ValueError as error:
      outcomes.append(error)
  threads = [threading.Thread(target=job) for _ in range(2)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  finished = [o for o in outcomes if isinstance(o, dict)]
  refused = [o for o in outcomes if isinstance(o, ValueError)]
  assert len(finished) == 1 and len(refused) == 1, outcomes
  assert "only 0 of the total epsilon 2 remains" in str(refused[0])
  assert sum(epsilon for _, _, epsilon in spends(state)) == pytest.approx(2.0)


def test_a_batch_larger_than_a_period_s_examples_is_refused_before_any_spend(tmp_path,
                                                                           monkeypatch):
  state = tmp_path / "state"
  with pytest.raises(ValueError, match="--batch-size 700 is more than the 300 training"):
    run(state, monkeypatch, StubTrainer(), "--batch-size", "700", "--streaming-period", "1")
  assert not (state / "ledger.jsonl").exists() or spends(state) == []


def test_dense_tables_that_leave_no_sparse_table_are_refused_before_any_spend(tmp_path,
                                                                              monkeypatch):
  state = tmp_path / "state"
  with pytest.raises(ValueError, match="makes all 26 tables of the model dense"):
    run(state, monkeypatch, StubTrainer(), "--algorithm", "adafest+", "--dense-tables", "auto")
  assert not (state / "ledger.jsonl").exists() or spends(state) == []


def test_light_users_out_of_range_are_refused_before_any_spend(tmp_path, monkeypatch):
  state = tmp_path / "state"
  with pytest.raises(ValueError, match=r"--light-users must be in \[0, 1\), got 1.5"):
    run(state, monkeypatch, StubTrainer(), "--light-users", "1.5")
  assert not (state / "ledger.jsonl").exists() or spends(state) == []
  summary = run(tmp_path / "light", monkeypatch, StubTrainer(), "--light-users", "0.3")
  assert [p["epsilon_spent"] for p in summary["periods"]] == pytest.approx([1, 2])


def test_a_job_resumes_past_settings_its_algorithm_does_not_read(tmp_path, monkeypatch):
  """A DP-SGD job begun at the threshold's and ratio's defaults before their rule resumes
  without them; so does a DP-AdaFEST job with an absolute --tau, whatever --tau-sigmas."""
  for algorithm, begun, resumed in (("dpsgd", ["--sigma-ratio", "2", "--tau-sigmas", "4"], []),
                                    ("adafest", ["--tau", "5", "--tau-sigmas", "4"],
                                     ["--tau", "5"])):
    state = tmp_path / algorithm
    with pytest.raises(KeyboardInterrupt):
      run(state, monkeypatch, StubTrainer(crash_at=1), "--algorithm", algorithm, *begun)
    trainer = StubTrainer()
    run(state, monkeypatch, trainer, "--algorithm", algorithm, *resumed)
    assert len(trainer.calls) == 2  # the period the crash left, then the next
