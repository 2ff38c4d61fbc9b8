"""The privacy ledger: sums, refusals that leave it untouched, and atomic writes under SIGKILL."""

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
  assert [json.loads(l)["kind"] for l in lines] == ["selection", "training"]
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


_WRITER = """
import sys
from sparse_dp.accounting.ledger import PrivacyLedger
ledger = PrivacyLedger(sys.argv[1], 1e9, 0.5)
for period in range(len(ledger.entries) + 1, 100000):
  ledger.record(period, "training", 1.0, 0.0, note="x" * 2000)
"""


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
