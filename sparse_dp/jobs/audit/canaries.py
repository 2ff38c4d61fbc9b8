"""Canaries for the pCTR model: fresh categorical ids, random labels, secret inclusion.

Canary ``j`` looks up row ``V_t + j`` of every table ``t`` (``V_t`` the table's vocabulary
size): the tables get ``m`` extra rows each, which no training example or other canary uses.
Its label is a fair coin and its integer features are zero. Each canary is included in the
training data independently with probability 1/2 (Steinke et al. 2023, §3), from a seed drawn
from the OS's cryptographic source unless one is given; the included canaries are appended
before the job Poisson-samples them, so ``q = B / N`` counts them in ``N``. See
docs/commands/audit.md ("How the audit computes").
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Optional, Sequence

import numpy as np

from sparse_dp.data.criteo_format import NUM_INTEGER


@dataclasses.dataclass(frozen=True)
class Canaries:
  """``m`` canaries against tables of ``vocabulary_sizes`` rows (before the canary rows)."""

  vocabulary_sizes: tuple[int, ...]
  labels: np.ndarray  # [m] float32, 0 or 1
  included: np.ndarray  # [m] bool: the secret the audit guesses

  @classmethod
  def draw(cls, count: int, vocabulary_sizes: Sequence[int],
           seed: Optional[int] = None) -> "Canaries":
    if count < 2:
      raise ValueError(f"--canaries must be >= 2, got {count}")
    rng = np.random.default_rng(seed if seed is not None else secrets.randbits(62))
    labels = rng.integers(0, 2, count).astype(np.float32)
    return cls(tuple(int(v) for v in vocabulary_sizes), labels, rng.random(count) < 0.5)

  @property
  def count(self) -> int:
    return len(self.labels)

  @property
  def model_vocabulary_sizes(self) -> list[int]:
    """Rows of each table with the canaries' own rows after the data's."""
    return [size + self.count for size in self.vocabulary_sizes]

  def inputs(self) -> tuple[dict, np.ndarray]:
    """``(features, labels)`` of every canary, included or not."""
    ids = np.asarray(self.vocabulary_sizes, np.int64)[None, :] + np.arange(self.count)[:, None]
    features = {"integers": np.zeros((self.count, NUM_INTEGER), np.float32), "categorical": ids}
    return features, self.labels[:, None]

  def insert(self, train: tuple[dict, np.ndarray]) -> tuple[dict, np.ndarray]:
    """``train`` with the included canaries appended (the job's sampler shuffles them)."""
    x, y = train
    too_large = [t for t, size in enumerate(self.vocabulary_sizes)
                 if x["categorical"][:, t].max(initial=0) >= size]
    if too_large:
      raise ValueError(f"training ids of tables {too_large} reach the canaries' rows: the "
                       "canaries' vocabulary sizes must be the data's")
    canary_x, canary_y = self.inputs()
    keep = self.included
    return ({name: np.concatenate([x[name], canary_x[name][keep].astype(x[name].dtype)])
             for name in x}, np.concatenate([y, canary_y[keep].astype(y.dtype)]))
