"""The main job's data: Criteo examples, a held-out split, a vocabulary, model inputs.

The vocabulary of a DP run must not be a function of the private training
data (a bucket seen once would reveal its example), so private algorithms get
:meth:`Vocabulary.hashed` into the public Table-3 sizes (times the synthetic
data's scale), or a vocabulary file the user declares public. Counting the
training data (``counted``) is offered only to ``none``.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence

import numpy as np
import pandas as pd

from sparse_dp.data.criteo import CriteoReader, integer_features
from sparse_dp.data.criteo_format import TABLE3_VOCABULARY_SIZES
from sparse_dp.data.vocabulary import Vocabulary

EVAL_SHARE = 0.1


@dataclasses.dataclass(frozen=True)
class CriteoSplit:
  """The first ``1 - EVAL_SHARE`` of the examples for training, the rest held out."""

  train: pd.DataFrame
  held_out: pd.DataFrame
  skipped_lines: int

  @classmethod
  def read(cls, paths: Sequence[pathlib.Path], max_examples: int,
           on_bad_line: str) -> "CriteoSplit":
    reader = CriteoReader(paths, on_bad_line=on_bad_line)
    frame = reader.read_all(max_examples)
    split = int(len(frame) * (1 - EVAL_SHARE))
    if split < 1 or split == len(frame):
      raise ValueError(f"{len(frame)} examples read: too few to hold out {EVAL_SHARE:.0%} "
                       "for evaluation (raise --max-examples or give more data)")
    return cls(frame.iloc[:split], frame.iloc[split:], reader.skipped_lines)


def hashed_vocabulary(table_scale: float) -> Vocabulary:
  """Each feature hashed into its Table-3 vocabulary size times ``table_scale`` (public)."""
  return Vocabulary.hashed([max(2, int(round(v * table_scale))) for v in TABLE3_VOCABULARY_SIZES])


def job_vocabulary(choice: str, split: CriteoSplit, private: bool, table_scale: float,
                   min_count: int) -> Vocabulary:
  """``choice``: ``hashed``, ``counted`` (non-private only) or a vocabulary JSON path."""
  if choice == "hashed":
    return hashed_vocabulary(table_scale)
  if choice == "counted":
    if private:
      raise ValueError("--vocabulary counted counts the private training data, which a DP "
                       "run must not publish; use --vocabulary hashed, or a vocabulary "
                       "file built on public data")
    return Vocabulary.build([split.train], min_count=min_count)
  path = pathlib.Path(choice)
  if not path.is_file():
    raise ValueError(f"--vocabulary {choice!r} is neither 'hashed', 'counted' nor a file")
  return Vocabulary.load(path)


def model_inputs(frame: pd.DataFrame, vocabulary: Vocabulary):
  """``(features, labels)`` of ``frame`` for the pCTR model."""
  features = {"integers": integer_features(frame), "categorical": vocabulary.encode(frame)}
  return features, frame["label"].to_numpy(np.float32)[:, None]
