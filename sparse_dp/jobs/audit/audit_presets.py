"""The audit's presets: the data, model and training of ``sparse-dp audit --preset``.

``smoke`` is the CI test's run (seconds per algorithm); ``full`` the committed
one (benchmarks/results/audit, minutes per algorithm on 2 CPU cores). Both use
synthetic Criteo data (tables ``scale`` x Ghazi et al.'s (NeurIPS 2023) Table 3) and a
small pCTR tower, and enough canaries that the non-private run can show a
bound well above epsilon = 1 (:mod:`sparse_dp.jobs.audit.bound`: the number of
guesses caps the bound).
"""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass(frozen=True)
class AuditPreset:
  examples: int  # read (10% held out)
  scale: float  # synthetic tables, x Table 3
  features: Optional[tuple[int, ...]]  # categorical features kept (None: all 26)
  canaries: int
  epochs: float
  batch_size: int
  learning_rate: float
  hidden_units: tuple[int, ...]
  delta: float
  fest_k: int


PRESETS = {
    "smoke": AuditPreset(examples=1000, scale=0.01, features=tuple(range(4)), canaries=128,
                         epochs=1.0, batch_size=64, learning_rate=0.01, hidden_units=(8,),
                         delta=1e-6, fest_k=100),
    "full": AuditPreset(examples=24_000, scale=0.05, features=tuple(range(13)), canaries=1000,
                        epochs=1.0, batch_size=512, learning_rate=0.01, hidden_units=(64, 64),
                        delta=1e-6, fest_k=300),
}
