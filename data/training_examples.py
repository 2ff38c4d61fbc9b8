"""Which examples a model was trained on, by content: one 64-bit hash of each example's features.

``sparse-dp train`` writes :data:`FILE` beside the saved model: the sorted,
distinct hashes of its training examples' 39 features (13 integers, 26
categorical values; the label left out, so an example with its label changed
still matches). ``sparse-dp distill --teacher`` hashes its distillation inputs
the same way and refuses those that hash into the record: a copy of the
training file, the same file by another path or link, or another file sharing
some of its examples, whatever its name.

The hash is pandas' ``hash_array`` (SipHash-2-4 with its fixed key) of each
feature, combined over the row (:func:`feature_hashes`), of the parsed example as
:class:`~sparse_dp.data.criteo.CriteoReader` reads it: integers as float64
(NaN: missing), categorical values as strings (``None``: missing). Two
different examples collide with probability ``2^-64``; among ``n`` recorded and
``m`` checked examples the chance that any one is refused wrongly is at most
``n m 2^-64`` (``4e-10`` for 400,000 and 40,000); a training example is never
missed. Cost: one vectorised pass over the DataFrame and 8 bytes per example.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pandas as pd

from sparse_dp.data.criteo_format import CATEGORICAL_NAMES, INTEGER_NAMES

FILE = "training_examples.npy"
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd: 2^64 / golden ratio


def feature_hashes(frame: pd.DataFrame) -> np.ndarray:
  """One uint64 per row of ``frame`` (a :class:`CriteoReader` frame): the hash of its features.

  Each column's values are hashed (``pd.util.hash_array``), and the row's ``k``
  column hashes ``h_i`` combined as ``sum_i h_i M^(k-1-i) mod 2^64`` with an odd
  ``M`` (invertible mod ``2^64``, so any one column's hash moves the row's
  uniformly: distinct rows collide with probability ``2^-64``).
  """
  columns = ([frame[name].to_numpy(np.float64) for name in INTEGER_NAMES]
             + [frame[name].to_numpy(object) for name in CATEGORICAL_NAMES])
  row = np.zeros(len(frame), np.uint64)
  with np.errstate(over="ignore"):
    for values in columns:
      row = row * _MULTIPLIER + pd.util.hash_array(values, categorize=False)
  return row


def save(frame: pd.DataFrame, folder: pathlib.Path) -> pathlib.Path:
  """Writes the distinct feature hashes of ``frame``'s examples to ``folder/FILE``."""
  path = pathlib.Path(folder) / FILE
  np.save(path, np.unique(feature_hashes(frame)))
  return path


def load(folder: pathlib.Path) -> np.ndarray:
  """The hashes ``sparse-dp train`` recorded in ``folder``; refused when there are none."""
  path = pathlib.Path(folder) / FILE
  if not path.is_file():
    raise ValueError(
        f"{str(folder)!r} has no record of its training examples ({FILE}), so distillation "
        "inputs cannot be checked to be other data: retrain it with 'sparse-dp train "
        "--reader pandas' (the default), which writes the record")
  hashes = np.load(path, allow_pickle=False)
  if hashes.dtype != np.uint64 or hashes.ndim != 1:
    raise ValueError(f"{path} is not a record of training examples (uint64 hashes)")
  return hashes


def count_recorded(frame: pd.DataFrame, recorded: np.ndarray) -> int:
  """How many examples of ``frame`` have the features of an example in ``recorded``."""
  return int(np.isin(feature_hashes(frame), recorded).sum())
