"""A privacy ledger: every spend of a privacy budget, on disk, written atomically.

One JSON object per line (``period``, ``kind``, ``epsilon``, ``delta`` and whatever the caller
adds). The spends compose by basic composition: ``epsilon_spent`` and ``delta_spent`` are the
sums of the entries', a bound that holds for any mechanisms, adaptively chosen, on any overlap
of data. Writes are atomic (a temporary file in the same folder, fsynced, renamed over the old
one, the folder fsynced), so a crash leaves the old ledger or the new one, never a torn line:
record a spend *before* publishing what it pays for. The file is the ledger: every sum and
check reads it from disk, and :meth:`PrivacyLedger.record` re-reads, checks and writes under
``flock(LOCK_EX)`` on ``.<name>.lock`` beside it, so processes spending from one ledger at
once never spend more than the total between them. See docs/commands/stream.md.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import pathlib
from typing import Iterator, Optional


class BudgetExceededError(ValueError):
  """A planned spend would take the ledger past its total budget."""


def check_budget(epsilon_total: float, delta_total: float) -> None:
  """Raises ``ValueError`` unless ``epsilon_total`` is finite and > 0, ``delta_total`` in [0, 1)."""
  if not (math.isfinite(epsilon_total) and epsilon_total > 0):
    raise ValueError(f"epsilon_total must be a finite number > 0, got {epsilon_total}")
  if not 0 <= delta_total < 1:
    raise ValueError(f"delta_total must be in [0, 1), got {delta_total}")


class PrivacyLedger:
  """The spends recorded at ``path`` against a total ``(epsilon_total, delta_total)``."""

  def __init__(self, path, epsilon_total: float, delta_total: float):
    check_budget(epsilon_total, delta_total)
    self.path = pathlib.Path(path)
    self.epsilon_total = epsilon_total
    self.delta_total = delta_total

  @property
  def entries(self) -> list[dict]:
    """The spends, read from the file now."""
    if not self.path.exists():
      return []
    return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

  @property
  def epsilon_spent(self) -> float:
    return math.fsum(e["epsilon"] for e in self.entries)

  @property
  def delta_spent(self) -> float:
    return math.fsum(e["delta"] for e in self.entries)

  @property
  def epsilon_remaining(self) -> float:
    return max(0.0, self.epsilon_total - self.epsilon_spent)

  @property
  def delta_remaining(self) -> float:
    return max(0.0, self.delta_total - self.delta_spent)

  def check(self, epsilon: float, delta: float, what: str = "this job") -> None:
    """Raises :class:`BudgetExceededError` unless ``(epsilon, delta)`` more fits the budget."""
    self._check_with(self.entries, epsilon, delta, what)

  def find(self, period: int, kind: str) -> Optional[dict]:
    return _find(self.entries, period, kind)

  def record(self, period: int, kind: str, epsilon: float, delta: float, **details) -> dict:
    """Appends one spend after checking the budget; durable when this returns."""
    if not (math.isfinite(epsilon) and epsilon >= 0) or not 0 <= delta < 1:
      raise ValueError(f"a spend needs epsilon >= 0 and delta in [0, 1), got {epsilon}, {delta}")
    with _exclusive(self.path.with_name(f".{self.path.name}.lock")):
      entries = self.entries
      if _find(entries, period, kind) is not None:
        raise ValueError(f"the ledger already has a {kind!r} spend for period {period}")
      self._check_with(entries, epsilon, delta, f"the {kind} spend of period {period}")
      entry = {"period": period, "kind": kind, "epsilon": epsilon, "delta": delta, **details}
      write_atomically(self.path, "".join(json.dumps(e) + "\n" for e in entries + [entry]))
    return entry

  def _check_with(self, entries: list[dict], epsilon: float, delta: float, what: str) -> None:
    epsilon_spent = math.fsum(e["epsilon"] for e in entries)
    delta_spent = math.fsum(e["delta"] for e in entries)
    # A relative slack of 1e-9 absorbs the rounding of splitting a budget in parts.
    if epsilon_spent + epsilon > self.epsilon_total * (1 + 1e-9) or (
        delta_spent + delta > self.delta_total * (1 + 1e-9)):
      raise BudgetExceededError(
          f"{what} needs epsilon {epsilon:.6g} (delta {delta:.3g}), but only "
          f"{max(0.0, self.epsilon_total - epsilon_spent):.6g} of the total epsilon "
          f"{self.epsilon_total:g} remains (spent {epsilon_spent:.6g}, delta {delta_spent:.3g} "
          f"of {self.delta_total:.3g}; ledger: {self.path})")


def _find(entries: list[dict], period: int, kind: str) -> Optional[dict]:
  return next((e for e in entries if e["period"] == period and e["kind"] == kind), None)


@contextlib.contextmanager
def _exclusive(lock_path: pathlib.Path) -> Iterator[None]:
  """Holds ``flock(LOCK_EX)`` on ``lock_path`` (created if absent), waiting for it."""
  descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(descriptor, fcntl.LOCK_EX)
    yield
  finally:
    os.close(descriptor)


def write_atomically(path, text: str, mode: int = 0o644) -> None:
  """Replaces ``path`` by ``text``: temporary file, flush, fsync, rename, fsync the folder.

  The file is created with permissions ``mode`` (0o600 for a secret).
  """
  path = pathlib.Path(path)
  temporary = path.with_name(f".{path.name}.tmp")
  if temporary.exists():
    temporary.unlink()  # a crash's leftover
  descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
  with open(descriptor, "w", encoding="utf-8") as handle:
    handle.write(text)
    handle.flush()
    os.fsync(handle.fileno())
  os.replace(temporary, path)
  folder = os.open(path.parent, os.O_RDONLY)
  try:
    os.fsync(folder)
  finally:
    os.close(folder)
