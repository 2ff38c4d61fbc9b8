"""The privacy ledger: sums, refusals that leave it untouched, atomic writes under SIGKILL,
and spends checked against the file, not a copy in memory, by one process at a time."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from sparse_dp.accounting.ledger import BudgetExceededError, PrivacyLedger


def test_ledger_sums_spends_and_refuses_past_the_budget(tmp_path):
  ledger = PrivacyLedger(tmp_path / "ledger.jsonl", epsilon_total=1.0, delta_total=1e-5)
  ledger.record(1, "selection", 0.1, 0.0, days=[1])
  ledger.record(1, "training", 0.5, 5e-6, days=[1])
  lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
  assert [json.loads(line)["kind"] for line in lines] == ["selection", "training"]
  assert json.loads(lines[0]) == {"period": 1, "kind": "selection", "epsilon": 0.1,
                                  "delta": 0.0, "days": [1]}
  reread = PrivacyLedger(tmp_path / "ledger.jsonl", 1.0, 1e-5)
  assert reread.epsilon_spent == pytest.approx(0.6) and reread.delta_spent == 5e-6
  before = (tmp_path / "ledger.jsonl").read_bytes()
  with pytest.raises(BudgetExceededError, match=r"only 0.4 of the total epsilon 1 remains"):
    reread.record(2, "training", 0.5, 1e-6)
  with pytest.raises(BudgetExceededError, match="delta"):
    reread.record(2, "training", 0.1, 6e-6)
  with pytest.raises(ValueError, match="already has a 'training' spend for period 1"):
    reread.record(1, "training", 0.1, 0.0)
  assert (tmp_path / "ledger.jsonl").read_bytes() == before
  reread.record(2, "training", 0.4, 5e-6)  # exactly the rest fits
  assert reread.epsilon_remaining == 0.0


def test_a_failed_write_leaves_the_old_ledger(tmp_path, monkeypatch):
  ledger = PrivacyLedger(tmp_path / "ledger.jsonl", 1.0, 1e-5)
  ledger.record(1, "training", 0.2, 0.0)
  before = (tmp_path / "ledger.jsonl").read_bytes()

  def crash(*_):
    raise OSError("disk gone")
  monkeypatch.setattr(os, "replace", crash)
  with pytest.raises(OSError):
    ledger.record(2, "training", 0.2, 0.0)
  assert (tmp_path / "ledger.jsonl").read_bytes() == before and len(ledger.entries) == 1
  monkeypatch.undo()
  ledger.record(2, "training", 0.2, 0.0)  # the leftover temporary file is replaced
  assert len(PrivacyLedger(tmp_path / "ledger.jsonl", 1.0, 1e-5).entries) == 2


def test_a_ledger_opened_before_another_spend_checks_the_file(tmp_path):
  early = PrivacyLedger(tmp_path / "ledger.jsonl", 1.0, 1e-5)
  PrivacyLedger(tmp_path / "ledger.jsonl", 1.0, 1e-5).record(1, "training", 0.7, 5e-6)
  assert early.epsilon_spent == pytest.approx(0.7) and early.delta_remaining == pytest.approx(5e-6)
  with pytest.raises(BudgetExceededError, match=r"only 0.3 of the total epsilon 1 remains"):
    early.record(2, "training", 0.7, 1e-6)
  with pytest.raises(ValueError, match="already has a 'training' spend for period 1"):
    early.record(1, "training", 0.1, 0.0)
  early.record(2, "training", 0.3, 5e-6)
  assert [e["period"]
          for e in PrivacyLedger(tmp_path / "ledger.jsonl", 1.0, 1e-5).entries] == [1, 2]


_SPENDER = """
import os, pathlib, sys, time
from sparse_dp.accounting.ledger import BudgetExceededError, PrivacyLedger
ledger = PrivacyLedger(sys.argv[1], 1.0, 1e-5)
go = pathlib.Path(sys.argv[2])
(go.parent / f"ready.{os.getpid()}").touch()
while not go.exists():
  time.sleep(0.001)
for spend in range(1000):
  try:
    ledger.record(os.getpid() * 1000 + spend, "training", 0.01, 1e-8)
  except BudgetExceededError:
    break
"""


@pytest.mark.slow
def test_processes_spending_at_once_never_spend_more_than_the_total(tmp_path):
  path, go = tmp_path / "ledger.jsonl", tmp_path / "go"
  spenders = [subprocess.Popen([sys.executable, "-c", _SPENDER, str(path), str(go)])
              for _ in range(3)]
  deadline = time.time() + 300
  while len(list(tmp_path.glob("ready.*"))) < 3 and time.time() < deadline:
    time.sleep(0.01)
  go.touch()  # all start spending together, once all are imported
  assert [spender.wait(timeout=300) for spender in spenders] == [0, 0, 0]
  entries = PrivacyLedger(path, 1.0, 1e-5).entries
  # 100 spends of 0.01 fill the budget exactly; no spend is lost or doubled.
  assert len(entries) == 100 and len({e["period"] for e in entries}) == 100
  assert sum(e["epsilon"] for e in entries) == pytest.approx(1.0)
  assert len({e["period"] // 1000 for e in entries}) > 1  # they did spend concurrently


_WRITER = """
import sys
from sparse_dp.accounting.ledger import PrivacyLedger
ledger = PrivacyLedger(sys.argv[1], 1e9, 0.5)
for period in range(len(ledger.entries) + 1, 100000):
  ledger.record(period, "training", 1.0, 0.0, note="x" * 2000)
"""


@pytest.mark.slow
def test_sigkill_at_any_moment_leaves_a_whole_ledger(tmp_path):
  path = tmp_path / "ledger.jsonl"
  written = 0
  for kill_after in (0.0, 0.013, 0.031, 0.07, 0.15):
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)])
    deadline = time.time() + 120
    while time.time() < deadline and (not path.exists() or path.stat().st_size <= written):
      time.sleep(0.002)  # until this writer has written (imports take a while)
    time.sleep(kill_after)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    lines = path.read_text().splitlines()
    entries = [json.loads(line) for line in lines]  # never a torn line
    assert [e["period"] for e in entries] == list(range(1, len(entries) + 1))
    assert path.stat().st_size > written
    written = path.stat().st_size
