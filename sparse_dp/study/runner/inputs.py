"""The examples a study trains and evaluates on: synthetic Criteo or real Criteo files.

Read as ``sparse-dp train`` reads them (:mod:`sparse_dp.models.pctr_data`): the
last 10% held out, categorical features hashed into the public Table-3 sizes
(times the synthetic data's scale), so no vocabulary depends on the private
data. A preset may keep only some categorical features (``features``). The
paper preset draws its synthetic data anew per seed (``data_seed``) and splits
the held-out tenth into a validation half, which picks a study's frontier
points, and a test half, which reports them (``test``).
"""

from __future__ import annotations

import dataclasses
import glob
import pathlib
from typing import Optional, Sequence

import numpy as np

from sparse_dp.data.synthetic import SyntheticCriteo
from sparse_dp.models import pctr_data

SYNTHETIC = "synthetic"


@dataclasses.dataclass(frozen=True)
class StudyInputs:
  """``train``, ``held_out`` (validation when ``test`` is given) and ``test`` as
  ``(features, labels)``; ``source`` says what they are."""

  train: tuple
  held_out: tuple
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
    split = pctr_data.CriteoSplit.read(paths, max_examples, "error")
    vocabulary = pctr_data.hashed_vocabulary(table_scale)
    columns = list(range(len(vocabulary.sizes))) if features is None else list(features)
    bad = [f for f in columns if not 0 <= f < len(vocabulary.sizes)]
    if bad or not columns:
      raise ValueError(f"features {bad or columns}: give indices in 0..{len(vocabulary.sizes) - 1}")

    def select(frame):
      x, y = pctr_data.model_inputs(frame, vocabulary)
      return {**x, "categorical": np.ascontiguousarray(x["categorical"][:, columns])}, y

    held_out, test = select(split.held_out), None
    if test_split:
      half = len(held_out[1]) // 2
      held_out, test = (({k: v[:half] for k, v in held_out[0].items()}, held_out[1][:half]),
                        ({k: v[half:] for k, v in held_out[0].items()}, held_out[1][half:]))
    source = {"data": data, "examples": examples, "max_examples": max_examples,
              "table_scale": table_scale, "features": columns,
              "train_examples": len(split.train), "held_out_examples": len(held_out[1]),
              **({"data_seed": data_seed} if data == SYNTHETIC and data_seed else {}),
              **({"test_examples": len(test[1])} if test_split else {})}
    return cls(select(split.train), held_out, tuple(vocabulary.sizes[f] for f in columns),
               source, test)

  @property
  def rows(self) -> int:
    """Rows of all embedding tables: DP-SGD's noise touches each of them every step."""
    return sum(self.vocabulary_sizes)


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
