"""Whether a pCTR run can fit in this machine's memory, decided before it trains.

A run of the job keeps every embedding table resident in float32 together with
its Adam slots (``m`` and ``v``; :class:`sparse_dp.optimizers.LazyAdam` updates
them row-sparsely but holds each as a full copy of the table), so it needs at
least

    4 bytes * (1 + 2) * sum_i V_i d_i,    d_i = int(2 V_i^0.25)   (App. D.1.1)

before any gradient, activation or noise; DP-SGD's dense noise (Alg. 1 with
every row kept) adds at least one more copy each step. DP-FEST's tables keep
only the top-k rows after preselection, so the bound is given for the
algorithms whose tables hold every row. A vocabulary scale whose bound exceeds
the memory this process may use cannot run here: the study records why rather
than being killed by the kernel part-way.
"""

from __future__ import annotations

import os
import pathlib
from typing import Optional, Sequence

from sparse_dp.models.pctr import embedding_dim

FLOAT32_BYTES = 4
ADAM_SLOTS = 2  # m and v of the job's Adam, each the size of the table
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def resident_bytes_lower_bound(vocabulary_sizes: Sequence[int], slots: int = ADAM_SLOTS) -> int:
  """Bytes of the tables of ``vocabulary_sizes`` rows and of an optimizer's ``slots``
  copies of them (Adam's two by default; SGD none, Adagrad one)."""
  weights = sum(v * embedding_dim(v) for v in vocabulary_sizes)
  return FLOAT32_BYTES * (1 + slots) * weights


def memory_limit_bytes() -> int:
  """Physical memory, or the cgroup's limit where one is set and lower."""
  limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  for path in map(pathlib.Path, _CGROUP_LIMITS):
    text = path.read_text().strip() if path.is_file() else ""
    if text.isdigit():
      limit = min(limit, int(text))
  return limit


def refusal(vocabulary_sizes: Sequence[int], limit: int) -> Optional[str]:
  """Why a run with every row of ``vocabulary_sizes`` cannot fit in ``limit`` bytes (None:
  it may)."""
  needed = resident_bytes_lower_bound(vocabulary_sizes)
  if needed <= limit:
    return None
  tables = needed // (1 + ADAM_SLOTS)
  return (f"needs at least {needed / 1e9:.1f} GB resident (tables {tables / 1e9:.1f} GB + "
          f"Adam's {ADAM_SLOTS} slots, {sum(vocabulary_sizes):,} rows), more than the "
          f"{limit / 1e9:.1f} GB this machine allows")
