"""The state of a streaming retrain: its budget, its jobs and their period plans.

``--state DIR`` holds ``stream.json`` (this state, with the stream's secret noise seed, readable
by its owner only: a period rerun after a crash draws exactly the noise of the run that
recorded its spend), ``ledger.jsonl`` (:class:`~sparse_dp.accounting.ledger.PrivacyLedger`),
``periods/<p>/`` (each completed period, published by one rename), ``stream.lock`` and the
synthetic days. A job plans each period's epsilon and delta when it starts (an unfinished job
resumes with its plan); a new job takes what remains of the budget and is refused, before any
spend, when too little remains. Delta is split like epsilon: a job planning ``e_job`` of the
remaining ``E_rem`` takes ``d_job = D_rem * min(1, e_job / E_rem)``, which keeps
``D_rem / E_rem = D_total / E_total``, so ``d_job = D_total * e_job / E_total``. See
docs/commands/stream.md.
"""

from __future__ import annotations

import json
import pathlib
import secrets
import shutil
from typing import Optional

from sparse_dp.accounting.ledger import (
  BudgetExceededError,
  PrivacyLedger,
  check_budget,
  write_atomically,
)

# Tolerance of comparing a plan to the budget it was split from.
_RELATIVE_SLACK = 1e-9
# A published period's SavedModel and weights (the next period warm-starts from these),
# inside its :meth:`StreamState.period_folder`.
MODEL_FOLDER = "model"
WEIGHTS_FILE = "weights.npz"


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
    check_budget(epsilon_total, delta_total)
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
    """Plans ``len(period_days)`` periods within the remaining budget, or refuses.

    Each period gets ``epsilon_per_period`` (default: the remaining epsilon
    over the periods) and the same share of the remaining delta (module doc).
    """
    ledger, count = self.ledger, len(period_days)
    remaining, delta_remaining = ledger.epsilon_remaining, ledger.delta_remaining
    spends = f"in {len(ledger.entries)} spends; ledger: {ledger.path}"
    if remaining <= _RELATIVE_SLACK * ledger.epsilon_total:
      raise BudgetExceededError(
          f"this job's {count} period(s) need a positive epsilon, but only {remaining:.6g} of "
          f"the total epsilon {ledger.epsilon_total:g} remains (spent {ledger.epsilon_spent:.6g} "
          f"{spends})")
    if delta_remaining <= _RELATIVE_SLACK * ledger.delta_total:
      raise BudgetExceededError(
          f"this job's {count} period(s) need a positive delta, but none of the total delta "
          f"{ledger.delta_total:.3g} remains (spent {ledger.delta_spent:.3g} {spends})")
    epsilon_each = epsilon_per_period if epsilon_per_period is not None else remaining / count
    delta_each = delta_remaining * min(1.0, epsilon_each * count / remaining) / count
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

  def drop_earlier_models(self) -> None:
    """Removes the SavedModel and weights of every period but the last (28 to 170 MB
    a period at the paper scale); each period's metrics and preselection stay, and
    the last period's model stays for a later job to warm-start from.

    Call it holding the state's :class:`~sparse_dp.jobs.stream.stream_lock.StateLock`.
    Refused while a job is unfinished: its next period warm-starts from the last one
    published, which may not be the last one planned.
    """
    job = self.unfinished_job()
    if job is not None:
      raise ValueError(f"{self.folder} has an unfinished job (periods "
                       f"{job['periods'][0]['period']}-{job['periods'][-1]['period']}): "
                       "its periods' models stay until it finishes")
    for period in range(1, self.last_period):
      folder = self.period_folder(period)
      if (folder / MODEL_FOLDER).is_dir():
        shutil.rmtree(folder / MODEL_FOLDER)
      (folder / WEIGHTS_FILE).unlink(missing_ok=True)
