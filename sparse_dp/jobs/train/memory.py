"""Whether a pCTR run can fit in this machine's memory, decided before it trains.

A run keeps every embedding table resident in float32 with its optimizer's state (updated
row-sparsely but held whole: ``2 R d`` floats for ``adam`` and ``lazy-adam``, ``R d`` for
``adagrad``, ``R`` for ``rowwise-adagrad``, none for ``sgd``), so it needs at least

    4 bytes * (sum_i (1 + s) V_i d_i + r sum_i V_i),    d_i = int(2 V_i^0.25)  (App. D.1.1)

(``s`` table-sized slots, ``r`` floats per row), plus :data:`OVERHEAD_BYTES`. DP-SGD's dense
noise is drawn one table at a time (:mod:`sparse_dp.mechanisms.noise.dense_noise`): a table
of at most ``CHUNK_ROWS`` rows holds :data:`DRAW_TEMPORARIES` times its bytes while drawn, a
larger one its noisy gradient and one chunk's draw. A vocabulary scale whose bound exceeds the
memory this process may use is not run, and the study records why
(``benchmarks/vocabulary_scale.py`` uses the same bound). See docs/optimizers.md and
docs/vocabulary_scale.md.
"""

from __future__ import annotations

import os
import pathlib
from typing import Optional, Sequence

from sparse_dp.models.pctr import embedding_dim

FLOAT32_BYTES = 4
GIB = 2**30
# Per --optimizer (models.job_flags.OPTIMIZERS): (table-sized slots, floats per row).
OPTIMIZER_STATE = {"adam": (2, 0), "lazy-adam": (2, 0), "adagrad": (1, 0),
                   "rowwise-adagrad": (0, 1), "sgd": (0, 0)}
# A noise draw (sparse_dp.mechanisms.randomness.gaussian) holds its uint64 Philox words and their
# two halves, each of the draw's bytes, then the draw itself.
DRAW_TEMPORARIES = 4
OVERHEAD_BYTES = 2 * GIB  # TensorFlow, the dense layers, the examples, the step's activations
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def table_bytes(vocabulary_sizes: Sequence[int], dim: Optional[int] = None) -> int:
  """Bytes of the float32 tables of ``vocabulary_sizes`` rows at the paper's dimensions, or
  at ``dim`` for every table (``--embedding-dim``)."""
  return FLOAT32_BYTES * sum(v * (dim or embedding_dim(v)) for v in vocabulary_sizes)


def _state(optimizer: str) -> tuple[int, int]:
  if optimizer not in OPTIMIZER_STATE:
    raise ValueError(f"--optimizer {optimizer!r}: choose from {', '.join(OPTIMIZER_STATE)}")
  return OPTIMIZER_STATE[optimizer]


def optimizer_bytes(vocabulary_sizes: Sequence[int], optimizer: str,
                    dim: Optional[int] = None) -> int:
  """Bytes of ``optimizer``'s state for the tables (:data:`OPTIMIZER_STATE`)."""
  slots, per_row = _state(optimizer)
  return (slots * table_bytes(vocabulary_sizes, dim)
          + FLOAT32_BYTES * per_row * sum(vocabulary_sizes))


def dense_noise_bytes(vocabulary_sizes: Sequence[int], algorithm: str,
                      dim: Optional[int] = None) -> int:
  """The most DP-SGD's noise on one table holds (0 for the other algorithms)."""
  if algorithm != "dpsgd":
    return 0
  return max(_table_noise_bytes(v, dim) for v in vocabulary_sizes)


def _table_noise_bytes(rows: int, dim: Optional[int]) -> int:
  """A table of at most ``CHUNK_ROWS`` rows: its draw (the noisy gradient is made in it);
  a larger one: its noisy gradient and one chunk's draw."""
  from sparse_dp.mechanisms.noise.dense_noise import CHUNK_ROWS
  row_bytes = FLOAT32_BYTES * (dim or embedding_dim(rows))
  draw = DRAW_TEMPORARIES * min(rows, CHUNK_ROWS) * row_bytes
  return draw if rows <= CHUNK_ROWS else rows * row_bytes + draw


def bytes_needed(vocabulary_sizes: Sequence[int], algorithm: str, optimizer: str,
                 dim: Optional[int] = None) -> int:
  """Resident bytes a run of ``algorithm`` with every row of the tables needs at least:
  the tables, the optimizer's state, DP-SGD's dense noise and :data:`OVERHEAD_BYTES`."""
  return (table_bytes(vocabulary_sizes, dim) + optimizer_bytes(vocabulary_sizes, optimizer, dim)
          + dense_noise_bytes(vocabulary_sizes, algorithm, dim) + OVERHEAD_BYTES)


def describe_needs(vocabulary_sizes: Sequence[int], algorithm: str, optimizer: str,
                   dim: Optional[int] = None) -> str:
  """:func:`bytes_needed` in GiB with its parts: ``'14.1 GiB (tables 11.1 + ...)'``."""
  slots, per_row = _state(optimizer)
  state = (f"{slots} table-sized slot{'s' if slots > 1 else ''}" if slots
           else "one accumulator per row" if per_row else "no slot")
  parts = [f"tables {table_bytes(vocabulary_sizes, dim) / GIB:.2f}",
           f"{optimizer}'s {state} {optimizer_bytes(vocabulary_sizes, optimizer, dim) / GIB:.2f}"]
  if algorithm == "dpsgd":
    parts.append(f"DP-SGD's dense noise of one table "
                 f"{dense_noise_bytes(vocabulary_sizes, algorithm, dim) / GIB:.2f}")
  parts.append(f"TensorFlow and the step {OVERHEAD_BYTES / GIB:.2f}")
  return (f"{bytes_needed(vocabulary_sizes, algorithm, optimizer, dim) / GIB:.1f} GiB ("
          + " + ".join(parts) + f" GiB; {sum(vocabulary_sizes):,} rows)")


def memory_limit_bytes() -> int:
  """Physical memory, or the cgroup's limit where one is set and lower."""
  limit = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
  for path in map(pathlib.Path, _CGROUP_LIMITS):
    text = path.read_text().strip() if path.is_file() else ""
    if text.isdigit():
      limit = min(limit, int(text))
  return limit


def refusal(vocabulary_sizes: Sequence[int], limit: int, algorithm: str,
            optimizer: str) -> Optional[str]:
  """Why a run of ``algorithm`` with ``optimizer`` and every row of ``vocabulary_sizes``
  cannot fit in ``limit`` bytes (None: it may)."""
  if bytes_needed(vocabulary_sizes, algorithm, optimizer) <= limit:
    return None
  return (f"needs at least {describe_needs(vocabulary_sizes, algorithm, optimizer)}, more "
          f"than the {limit / GIB:.1f} GiB this machine allows")
