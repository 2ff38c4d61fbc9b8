"""The state of a streaming retrain: its budget, its jobs and their period plans.

``--state DIR`` holds ``stream.json`` (this state), ``ledger.jsonl`` (the
:class:`~sparse_dp.accounting.ledger.PrivacyLedger`), ``periods/<p>/`` (each
completed period's SavedModel, weights and metrics, published by one rename)
and the synthetic days. ``stream.json`` also keeps the stream's secret noise
seed (the file is made readable by its owner only): a period rerun after a
crash draws exactly the noise of the run that recorded its spend, so the
rerun publishes what that spend paid for, not a second sample.

A job plans its periods when it starts: each period's training epsilon and
delta, and its selection epsilon where DP-FEST / DP-AdaFEST+ select. A job
found unfinished is resumed with the same plan; a new job on a state takes
what remains of the budget (``--epsilon-per-period`` takes less) and is
refused, before any spend, when nothing or too little remains.
"""

from __future__ import annotations

import json
import pathlib
import secrets
from typing import Optional

from sparse_dp.accounting.ledger import BudgetExceededError, PrivacyLedger, write_atomically

# Tolerance of comparing a plan to the budget it was split from.
_RELATIVE_SLACK = 1e-9


class StreamState:
  """``stream.json`` of one state folder, and its ledger."""

  def __init__(self, folder: pathlib.Path, record: dict):
    self.folder = folder
    self.record = record
    self.ledger = PrivacyLedger(folder / "ledger.jsonl", record["epsilon_total"],
                                record["delta_total"])

  @classmethod
  def open(cls, folder, epsilon_total: Optional[float], delta_total: float) -> "StreamState":
    """Loads the state in ``folder``, or starts one with ``epsilon_total``."""
    folder = pathlib.Path(folder)
    path = folder / "stream.json"
    if path.exists():
      record = json.loads(path.read_text())
      if epsilon_total is not None and epsilon_total != record["epsilon_total"]:
        raise ValueError(f"--total-epsilon {epsilon_total:g} differs from the total "
                         f"{record['epsilon_total']:g} this state ({folder}) was started with; "
                         "a stream's budget cannot change")
      return cls(folder, record)
    if epsilon_total is None:
      raise ValueError(f"{folder} holds no stream yet: give --total-epsilon to start one")
    PrivacyLedger(folder / "ledger.jsonl", epsilon_total, delta_total)  # checks the budget
    folder.mkdir(parents=True, exist_ok=True)
    return cls(folder, {"epsilon_total": epsilon_total, "delta_total": delta_total,
                        "seed": secrets.randbits(62), "jobs": []})

  @property
  def seed(self) -> int:
    return self.record["seed"]

  @property
  def jobs(self) -> list[dict]:
    return self.record["jobs"]

  @property
  def last_period(self) -> int:
    return max((p["period"] for job in self.jobs for p in job["periods"]), default=0)

  def unfinished_job(self) -> Optional[dict]:
    return next((job for job in self.jobs if not job["finished"]), None)

  def start_job(self, settings: dict, period_days: list[list[int]], selects: list[bool],
                selection_share: float, epsilon_per_period: Optional[float]) -> dict:
    """Plans ``len(period_days)`` periods within the remaining budget, or refuses."""
    ledger, count = self.ledger, len(period_days)
    delta_each = (self.record["delta_total"] - ledger.delta_spent) / count
    remaining = ledger.epsilon_remaining
    epsilon_each = epsilon_per_period if epsilon_per_period is not None else remaining / count
    if remaining <= _RELATIVE_SLACK * ledger.epsilon_total or delta_each <= 0:
      raise BudgetExceededError(
          f"this job's {count} period(s) need a positive epsilon, but only {remaining:.6g} of "
          f"the total epsilon {ledger.epsilon_total:g} remains (spent {ledger.epsilon_spent:.6g} "
          f"in {len(ledger.entries)} spends; ledger: {ledger.path})")
    ledger.check(epsilon_each * count, delta_each * count, f"this job's {count} period(s)")
    first = self.last_period + 1
    periods = []
    for offset, (days, select) in enumerate(zip(period_days, selects)):
      selection = epsilon_each * selection_share if select else 0.0
      periods.append({"period": first + offset, "days": days, "selection_epsilon": selection,
                      "training_epsilon": epsilon_each - selection, "delta": delta_each})
    job = {"settings": settings, "periods": periods, "finished": False}
    self.jobs.append(job)
    self.save()
    return job

  def finish(self, job: dict) -> None:
    job["finished"] = True
    self.save()

  def save(self) -> None:
    path = self.folder / "stream.json"
    write_atomically(path, json.dumps(self.record, indent=2), mode=0o600)

  def period_folder(self, period: int) -> pathlib.Path:
    return self.folder / "periods" / str(period)
