"""The examples a study trains and evaluates on: synthetic Criteo or real Criteo files.

Read as ``sparse-dp train`` reads them (:mod:`sparse_dp.models.pctr_data`): the
last 10% held out, categorical features hashed into the public Table-3 sizes
(times the synthetic data's scale), so no vocabulary depends on the private
data. A preset may keep only some categorical features (``features``). The
paper preset draws its synthetic data anew per seed (``data_seed``) and splits
the held-out tenth into a validation half, which picks a study's frontier
points, and a test half, which reports them (``test``). A study that trains
nothing (``--from-cache``) describes a synthetic draw without drawing it
(:meth:`StudyInputs.described`).
"""

from __future__ import annotations

import dataclasses
import glob
import pathlib
from typing import Optional, Sequence

from sparse_dp.data.synthetic import SyntheticCriteo
from sparse_dp.models import pctr_data

SYNTHETIC = "synthetic"


@dataclasses.dataclass(frozen=True)
class StudyInputs:
  """``train``, ``held_out`` (validation when ``test`` is given) and ``test`` as
  ``(features, labels)`` (None in a :meth:`described` draw); ``source`` says
  what they are."""

  train: Optional[tuple]
  held_out: Optional[tuple]
  vocabulary_sizes: tuple[int, ...]
  source: dict
  test: Optional[tuple] = None

  @classmethod
  def load(cls, data: str, examples: int, scale: float, features: Optional[Sequence[int]],
           folder: pathlib.Path, hash_scale: Optional[float] = None,
           max_examples: Optional[int] = None, data_seed: int = 0,
           test_split: bool = False) -> "StudyInputs":
    """``data``: ``synthetic`` (``examples`` lines of generator seed ``data_seed``
    written under ``folder``, tables ``scale`` x Table 3) or a path or glob of Criteo
    files (hashed into Table-3 sizes x ``hash_scale``, default 1), read whole unless
    ``max_examples`` caps the lines read. ``test_split``: the held-out tenth's first half
    is the validation set (``held_out``), its second the ``test`` set."""
    paths, table_scale = data_paths(data, examples, scale, folder, data_seed)
    if data != SYNTHETIC and hash_scale is not None:
      table_scale = hash_scale
    vocabulary = pctr_data.hashed_vocabulary(table_scale)
    columns = _columns(features, len(vocabulary.sizes))
    split = pctr_data.EncodedSplit.read(paths, max_examples, "error", vocabulary, columns)
    counts = _split_counts(len(split.train[1]) + len(split.held_out[1]), test_split)
    validation, held_out_end = counts["held_out_examples"], len(split.held_out[1])
    test = (pctr_data.example_rows(split.held_out, validation, held_out_end) if test_split
            else None)
    return cls(split.train, pctr_data.example_rows(split.held_out, 0, validation),
               tuple(vocabulary.sizes[f] for f in columns),
               {**_drawn(data, examples, max_examples, table_scale, columns, data_seed),
                **counts}, test)

  @classmethod
  def described(cls, examples: int, scale: float, features: Optional[Sequence[int]],
                max_examples: Optional[int] = None, data_seed: int = 0,
                test_split: bool = False) -> "StudyInputs":
    """The synthetic draw :meth:`load` would give, described without drawing it: its
    ``source``, which a run's cache key holds, and its tables, but no examples
    (``train``, ``held_out`` and ``test`` are None); for a study that trains nothing.
    The generator writes ``examples`` well-formed lines, so the counts read follow from
    the settings. Criteo files can change under their names, so they are always read."""
    vocabulary = pctr_data.hashed_vocabulary(scale)
    columns = _columns(features, len(vocabulary.sizes))
    read = examples if max_examples is None else min(examples, max_examples)
    return cls(None, None, tuple(vocabulary.sizes[f] for f in columns),
               {**_drawn(SYNTHETIC, examples, max_examples, scale, columns, data_seed),
                **_split_counts(read, test_split)})

  @property
  def rows(self) -> int:
    """Rows of all embedding tables: DP-SGD's noise touches each of them every step."""
    return sum(self.vocabulary_sizes)


def _split_counts(read: int, test_split: bool) -> dict:
  """The source's counts of the splits of ``read`` examples: the last tenth held out
  (:func:`pctr_data.held_out_start`), halved into validation (``held_out_examples``)
  and test (``test_examples``) where ``test_split``."""
  train = pctr_data.held_out_start(read)
  held_out = read - train
  if not test_split:
    return {"train_examples": train, "held_out_examples": held_out}
  return {"train_examples": train, "held_out_examples": held_out // 2,
          "test_examples": held_out - held_out // 2}


def _drawn(data: str, examples: int, max_examples: Optional[int], table_scale: float,
           columns: list[int], data_seed: int) -> dict:
  """The part of a study's ``source`` that says which data it reads (not what it read)."""
  return {"data": data, "examples": examples, "max_examples": max_examples,
          "table_scale": table_scale, "features": columns,
          **({"data_seed": data_seed} if data == SYNTHETIC and data_seed else {})}


def _columns(features: Optional[Sequence[int]], tables: int) -> list[int]:
  """The categorical features kept (all ``tables`` where ``features`` is None)."""
  columns = list(range(tables)) if features is None else list(features)
  bad = [f for f in columns if not 0 <= f < tables]
  if bad or not columns:
    raise ValueError(f"features {bad or columns}: give indices in 0..{tables - 1}")
  return columns


def data_paths(data: str, examples: int, scale: float, folder: pathlib.Path,
               seed: int = 0) -> tuple[list[pathlib.Path], float]:
  """The Criteo files of ``data`` (synthetic: drawn with generator seed ``seed``) and
  their tables' scale relative to Table 3."""
  if data != SYNTHETIC:
    paths = sorted(pathlib.Path(p) for p in glob.glob(data))
    if not paths:
      raise ValueError(f"--data {data!r} matches no file (give 'synthetic' or Criteo files)")
    return paths, 1.0
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / f"synthetic_scale{scale:g}_{examples}{f'_seed{seed}' if seed else ''}.gz"
  if not path.exists():  # written whole, then renamed: never half a file
    partial = path.with_name(f".{path.name}.partial.gz")
    SyntheticCriteo(scale=scale, seed=seed).write_day(partial, 1, examples)
    partial.rename(path)
  return [path], scale
