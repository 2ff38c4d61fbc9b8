"""Per-feature vocabularies of Criteo's categorical features.

Each feature maps its raw values (hex strings) to ids: ``0`` for a missing
value, ``1`` for a value outside the vocabulary, ``2..`` for the kept buckets
in order of decreasing training frequency. A bucket is kept when it occurs at
least ``min_count`` times, and at most ``max_size`` are kept. With
``hash_buckets`` the values are hashed into that many buckets instead (ids
``2..hash_buckets+1``). The counts are kept so that DP-FEST can use them as a
public prior when the user declares them public.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import zlib
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
      hashed = np.fromiter((zlib.crc32(str(v).encode()) % self.hash_buckets
                            for v in values.fillna("")), np.int64, len(values))
      ids = FIRST_BUCKET_ID + hashed
    else:
      lookup = {bucket: FIRST_BUCKET_ID + i for i, bucket in enumerate(self.buckets)}
      ids = values.map(lookup).fillna(OOV_ID).to_numpy(dtype=np.int64)
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
