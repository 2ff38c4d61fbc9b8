"""A synthetic Criteo dataset, written in the real Criteo format.

Each categorical feature ``f`` has the vocabulary size of Ghazi et al.'s (NeurIPS 2023)
Table 3 (times ``scale``), bucket popularity ``p(rank r) ~ (r + 1)^-1.1``
(Zipf-like), and a planted effect ``w_f[bucket] ~ N(0, 0.35^2)``; integer
features are log-normal counts. The label of an example is drawn from
``sigmoid(bias + sum_f w_f[bucket_f] + u . log(1 + ints))``, so the planted
model's AUC on the data (``planted_auc``) is the best any model can reach.

Days ``day_0`` to ``day_23`` drift (the time series of §4.3); ``light_users = s > 0`` makes
the first feature a user id with a long tail of light users. Everything is a function of
``seed``. See docs/commands/train.md ("The data").
"""

from __future__ import annotations

import dataclasses
import gzip
import pathlib
from typing import Iterator

import numpy as np

from sparse_dp.data.criteo_format import NUM_INTEGER, TABLE3_VOCABULARY_SIZES

_ZIPF_EXPONENT = 1.1
_EFFECT_STD = 0.35
_LOG_COUNT_MEAN = 1.4  # about E[log(1 + floor(LogNormal(1, 1.5)))]: centres the integer term
_MISSING_RATE = 0.05
USER_FEATURE = 0  # the user id of ``light_users`` (1,472 rows at scale 1)
_HEAVY_USERS = 0.05  # share of the user ranks that are heavy users
_USER_EFFECT_STD = 1.0
_HASH_MULTIPLIER = 0x9E3779B1  # odd: a bijection of 32-bit integers


@dataclasses.dataclass(frozen=True)
class SyntheticCriteo:
  """The synthetic dataset's definition; ``write_day`` materialises a day."""

  scale: float = 1.0
  seed: int = 0
  num_days: int = 24
  drift: float = 0.2  # share of the top-1000 ranks re-assigned per day
  light_users: float = 0.0  # share of the examples from the user feature's light users

  def __post_init__(self):
    if not self.scale > 0:
      raise ValueError(f"scale must be > 0, got {self.scale}")
    if not 1 <= self.num_days <= 24:
      raise ValueError(f"num_days must be in 1..24, got {self.num_days}")
    if not 0 <= self.drift <= 1:
      raise ValueError(f"drift must be in [0, 1], got {self.drift}")
    if not 0 <= self.light_users < 1:
      raise ValueError(f"light_users must be in [0, 1), got {self.light_users}")

  @property
  def vocabulary_sizes(self) -> tuple[int, ...]:
    return tuple(max(2, int(round(v * self.scale))) for v in TABLE3_VOCABULARY_SIZES)

  def _popularity(self, feature: int) -> np.ndarray:
    """Probability of each popularity rank of ``feature``."""
    size = self.vocabulary_sizes[feature]
    if feature != USER_FEATURE or not self.light_users:
      weights = (np.arange(size) + 1.0) ** -_ZIPF_EXPONENT
      return weights / weights.sum()
    heavy = max(1, int(np.ceil(_HEAVY_USERS * size)))
    weights = (np.arange(heavy) + 1.0) ** -_ZIPF_EXPONENT
    light = np.full(size - heavy, self.light_users / max(size - heavy, 1))
    return np.concatenate([(1.0 - self.light_users) * weights / weights.sum(), light])

  def _planted(self):
    rng = np.random.default_rng([self.seed, 0])
    effects = []
    for f, size in enumerate(self.vocabulary_sizes):
      strong = f == USER_FEATURE and self.light_users
      effect = rng.normal(0.0, _USER_EFFECT_STD if strong else _EFFECT_STD, size)
      # Centred on day 0's traffic, so a popular bucket's draw does not move
      # the click rate; it stays ~25% (Criteo's) whatever the seed.
      effects.append(effect - self._popularity(f) @ effect[self._ranking(f, 0)])
    integer_weights = rng.normal(0.0, 0.3, NUM_INTEGER)
    return effects, integer_weights, -1.45

  def _ranking(self, feature: int, day: int) -> np.ndarray:
    """``ranking[r]`` is the bucket of popularity rank ``r`` on ``day`` (0-based)."""
    size = self.vocabulary_sizes[feature]
    ranking = np.random.default_rng([self.seed, 1, feature]).permutation(size)
    for d in range(1, day + 1):
      rng = np.random.default_rng([self.seed, 2, feature, d])
      top = min(1000, size)
      moved = rng.choice(top, int(self.drift * top), replace=False)
      targets = rng.choice(size, len(moved), replace=False)
      ranking[moved], ranking[targets] = ranking[targets], ranking[moved].copy()
    return ranking

  def examples(self, day: int, count: int) -> dict[str, np.ndarray]:
    """``count`` examples of ``day``.

    Keys: ``labels``, ``integers`` with ``integer_missing``, ``buckets``
    (-1: missing), and the planted click ``probabilities``.
    """
    if not 0 <= day < self.num_days:
      raise ValueError(f"day must be in 0..{self.num_days - 1} (Criteo-1TB's day_0.."
                       f"day_23), got {day}")
    rng = np.random.default_rng([self.seed, 3, day])
    effects, integer_weights, bias = self._planted()
    buckets = np.empty((count, len(effects)), np.int64)
    logits = np.full(count, bias)
    for f, size in enumerate(self.vocabulary_sizes):
      ranks = rng.choice(size, count, p=self._popularity(f))
      buckets[:, f] = self._ranking(f, day)[ranks]
      logits += effects[f][buckets[:, f]]
    integers = np.floor(rng.lognormal(1.0, 1.5, (count, NUM_INTEGER))).astype(np.int64)
    logits += (np.log1p(integers) - _LOG_COUNT_MEAN) @ integer_weights / 3.0
    labels = (rng.random(count) < 1.0 / (1.0 + np.exp(-logits))).astype(np.int64)
    buckets[rng.random(buckets.shape) < _MISSING_RATE] = -1
    return {"labels": labels, "integers": integers, "buckets": buckets,
            "integer_missing": rng.random(integers.shape) < _MISSING_RATE,
            "probabilities": 1.0 / (1.0 + np.exp(-logits))}

  def lines(self, day: int, count: int) -> Iterator[str]:
    """The examples of :meth:`examples` as Criteo text lines."""
    data = self.examples(day, count)
    for label, ints, missing, cats in zip(data["labels"], data["integers"],
                                          data["integer_missing"], data["buckets"]):
      fields = [str(label)]
      fields += ["" if gone else str(v) for v, gone in zip(ints, missing)]
      fields += ["" if b < 0 else _hex_hash(f, b) for f, b in enumerate(cats)]
      yield "\t".join(fields)

  def write_day(self, path, day: int, count: int) -> pathlib.Path:
    """Writes ``count`` examples of ``day`` to ``path`` (gzip if it ends in ``.gz``)."""
    path = pathlib.Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt", newline="\n") as out:
      for line in self.lines(day, count):
        out.write(line + "\n")
    return path


def _hex_hash(feature: int, bucket: int) -> str:
  return f"{((int(bucket) + (feature << 24)) * _HASH_MULTIPLIER) & 0xFFFFFFFF:08x}"


def planted_auc(labels: np.ndarray, probabilities: np.ndarray) -> float:
  """AUC of the planted probabilities: the best AUC a model can expect."""
  order = np.argsort(probabilities, kind="mergesort")
  ranks = np.empty(len(order))
  ranks[order] = np.arange(1, len(order) + 1)
  positives = labels == 1
  n_pos, n_neg = positives.sum(), (~positives).sum()
  return float((ranks[positives].sum() - n_pos * (n_pos + 1) / 2) / max(n_pos * n_neg, 1))
