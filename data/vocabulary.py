"""Per-feature vocabularies of Criteo's categorical features.

Each feature maps its raw values (hex strings) to ids: ``0`` for a missing
value, ``1`` for a value outside the vocabulary, ``2..`` for the kept buckets
in order of decreasing training frequency (at least ``min_count`` occurrences, at most
``max_size`` kept). With ``hash_buckets`` the values are hashed into that many buckets
instead (ids ``2..hash_buckets+1``) by TensorFlow's stable FarmHash fingerprint, the same
function the ``tf.data`` reader applies. A vocabulary counted on the training data is a
function of it, so DP training needs :meth:`Vocabulary.hashed` (data-independent) or one
counted on public data. See docs/commands/train.md ("The data").
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Optional

import numpy as np
import pandas as pd

from sparse_dp.data.criteo_format import CATEGORICAL_NAMES

MISSING_ID = 0
OOV_ID = 1
FIRST_BUCKET_ID = 2


@dataclasses.dataclass
class FeatureVocabulary:
  """One feature's kept buckets (most frequent first) and their training counts."""

  name: str
  buckets: list[str]
  counts: list[int]
  hash_buckets: Optional[int] = None

  @property
  def size(self) -> int:
    """Rows its embedding table needs (missing and OOV included)."""
    return FIRST_BUCKET_ID + (self.hash_buckets or len(self.buckets))

  def encode(self, values: pd.Series) -> np.ndarray:
    """int64 ids of ``values`` (``None`` for missing)."""
    missing = values.isna().to_numpy()
    if self.hash_buckets:
      ids = FIRST_BUCKET_ID + hash_buckets(values.to_numpy(dtype=object), self.hash_buckets)
    else:
      lookup = {bucket: FIRST_BUCKET_ID + i for i, bucket in enumerate(self.buckets)}
      ids = values.map(lookup).fillna(OOV_ID).to_numpy(dtype=np.int64, copy=True)
    ids[missing] = MISSING_ID
    return ids


class Vocabulary:
  """The vocabularies of the 26 categorical features."""

  def __init__(self, features: list[FeatureVocabulary]):
    self.features = features

  @classmethod
  def build(cls, frames, min_count: int = 1, max_size: Optional[int] = None,
            hash_buckets: Optional[int] = None) -> "Vocabulary":
    """Counts buckets over the DataFrames ``frames`` (e.g. a CriteoReader)."""
    if min_count < 1:
      raise ValueError(f"min_count must be >= 1, got {min_count}")
    if max_size is not None and max_size < 1:
      raise ValueError(f"max_size must be >= 1, got {max_size}")
    counts = {name: pd.Series(dtype=np.int64) for name in CATEGORICAL_NAMES}
    for frame in frames:
      for name in CATEGORICAL_NAMES:
        counts[name] = counts[name].add(frame[name].value_counts(), fill_value=0)
    features = []
    for name in CATEGORICAL_NAMES:
      ordered = counts[name].astype(np.int64)
      ordered = ordered[ordered >= min_count]
      ordered = ordered.iloc[np.lexsort((ordered.index.to_numpy(dtype=str), -ordered.to_numpy()))]
      if max_size is not None:
        ordered = ordered.iloc[:max_size]
      features.append(FeatureVocabulary(name, [str(b) for b in ordered.index],
                                        [int(c) for c in ordered.to_numpy()], hash_buckets))
    return cls(features)

  @classmethod
  def hashed(cls, buckets_per_feature) -> "Vocabulary":
    """A data-independent vocabulary: feature ``f`` hashed into ``buckets_per_feature[f]``."""
    buckets_per_feature = list(buckets_per_feature)
    if len(buckets_per_feature) != len(CATEGORICAL_NAMES):
      raise ValueError(f"need {len(CATEGORICAL_NAMES)} bucket counts, got "
                       f"{len(buckets_per_feature)}")
    if any(not isinstance(b, int) or b < 1 for b in buckets_per_feature):
      raise ValueError(f"bucket counts must be integers >= 1, got {buckets_per_feature}")
    return cls([FeatureVocabulary(name, [], [], hash_buckets=b)
                for name, b in zip(CATEGORICAL_NAMES, buckets_per_feature)])

  def leading(self, count: Optional[int]) -> "Vocabulary":
    """The vocabularies of the first ``count`` features (all of them where ``count`` is None).

    A model of fewer tables over the same files: the readers encode a vocabulary's
    features in order, from the first categorical column on.

    Args:
      count: how many features to keep, from the first; None keeps all.

    Returns:
      A vocabulary of those features.

    Raises:
      ValueError: ``count`` is not in ``1..len(features)``.
    """
    if count is None:
      return self
    if not 1 <= count <= len(self.features):
      raise ValueError(f"--categorical-features must be in 1..{len(self.features)}, "
                       f"got {count}")
    return Vocabulary(self.features[:count])

  @property
  def is_hashed(self) -> bool:
    return all(f.hash_buckets for f in self.features)

  @property
  def sizes(self) -> list[int]:
    return [f.size for f in self.features]

  def encode(self, frame: pd.DataFrame) -> np.ndarray:
    """``[N, 26]`` int64 ids of ``frame``'s categorical features."""
    return np.stack([f.encode(frame[f.name]) for f in self.features], axis=1)

  def save(self, path) -> pathlib.Path:
    path = pathlib.Path(path)
    path.write_text(json.dumps([dataclasses.asdict(f) for f in self.features]))
    return path

  @classmethod
  def load(cls, path) -> "Vocabulary":
    return cls([FeatureVocabulary(**f) for f in json.loads(pathlib.Path(path).read_text())])


def hash_buckets(values: np.ndarray, num_buckets: int) -> np.ndarray:
  """``values`` (strings) hashed to ``[0, num_buckets)`` by FarmHash Fingerprint64.

  Hashes each distinct value once (Criteo features repeat heavily), found by a hash
  table (``pd.factorize``, O(n)), not a sort. A missing value (``None``) gets bucket 0.
  """
  import tensorflow as tf
  codes, distinct = pd.factorize(values)  # a missing value's code is -1
  hashed = tf.strings.to_hash_bucket_fast(np.asarray(distinct, dtype=str), num_buckets).numpy()
  return np.append(hashed, 0)[codes]
