"""Synthetic days drawn once and reused: a cache keyed by everything that defines the draw.

A synthetic day is a function of the dataset's definition (:class:`SyntheticCriteo`'s fields),
the day, the number of examples and the generator's code; drawing the 400,000 examples of the
default job takes about a minute, and every run of the job drew them again. The cache keeps
each draw under ``$SPARSE_DP_CACHE_DIR`` (else ``$XDG_CACHE_HOME/sparse_dp``, else
``~/.cache/sparse_dp``) in ``synthetic/<key>.gz``, the key a SHA-256 of those inputs and of the
generator's source; the job still reads the file it is given, so the reading path is the one
real data takes. A file is written under a temporary name and renamed into place: a draw that
is stopped leaves no entry (a killed one, a hidden ``.partial`` file that is never read).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil

from sparse_dp.data import synthetic
from sparse_dp.data.synthetic import SyntheticCriteo

CACHE_ENV = "SPARSE_DP_CACHE_DIR"


def cache_dir() -> pathlib.Path:
  """The cache's folder: ``$SPARSE_DP_CACHE_DIR``, else ``$XDG_CACHE_HOME/sparse_dp``, else
  ``~/.cache/sparse_dp``."""
  if os.environ.get(CACHE_ENV):
    return pathlib.Path(os.environ[CACHE_ENV])
  base = os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache"
  return pathlib.Path(base) / "sparse_dp"


def draw_key(dataset: SyntheticCriteo, day: int, count: int) -> str:
  """SHA-256 of the draw's definition: the dataset's fields, the day, the count and the
  generator's source (a change to the generator is a new draw)."""
  source = pathlib.Path(synthetic.__file__).read_bytes()
  definition = json.dumps({"dataset": dataclasses.asdict(dataset), "day": int(day),
                           "count": int(count)}, sort_keys=True, default=str)
  return hashlib.sha256(definition.encode() + b"\0" + source).hexdigest()


def write_day(dataset: SyntheticCriteo, path, day: int, count: int) -> tuple[pathlib.Path, bool]:
  """``dataset.write_day(path, day, count)``, from the cache when the same draw was made before.

  Args:
    dataset: the synthetic dataset.
    path: where the day is wanted (a ``.gz`` path).
    day: the day.
    count: the examples.

  Returns:
    ``(path, reused)``: the file, and whether it came from the cache.
  """
  path = pathlib.Path(path)
  cached = cache_dir() / "synthetic" / f"{draw_key(dataset, day, count)}{path.suffix}"
  reused = cached.exists()
  if not reused:
    cached.parent.mkdir(parents=True, exist_ok=True)
    # The suffix last: write_day compresses a ".gz" path.
    partial = cached.with_name(f".{cached.stem}.{os.getpid()}.partial{path.suffix}")
    try:
      dataset.write_day(partial, day, count)
      os.replace(partial, cached)
    finally:
      partial.unlink(missing_ok=True)
  partial = path.with_name(f"{path.name}.partial")
  shutil.copyfile(cached, partial)  # a copy: the job's folder stays its own
  os.replace(partial, path)
  return path, reused
