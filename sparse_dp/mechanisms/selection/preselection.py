"""DP-FEST's preselection over every table of a model (Ghazi et al., NeurIPS 2023, §3.1).

Each table whose vocabulary exceeds ``k`` keeps ``k`` buckets chosen by
:func:`dp_top_k` on its counts of distinct examples, at ``epsilon / m`` for
the ``m`` such tables, so the whole preselection is ``epsilon``-DP by basic
composition; a table of at most ``k`` buckets keeps them all, at no cost (the
choice does not look at the data). The kept buckets become ids ``0..k-1`` and
every other bucket the shared out-of-vocabulary id ``k``
(:class:`BucketRemapping`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from sparse_dp.accounting.algorithms import check_positive
from sparse_dp.mechanisms.randomness import seeds
from sparse_dp.mechanisms.rows.remapping import BucketRemapping
from sparse_dp.mechanisms.selection.top_k import dp_top_k


@dataclasses.dataclass(frozen=True)
class Preselection:
  """One remapping per table (``None``: the table is kept whole) and its epsilon."""

  remappings: tuple[Optional[BucketRemapping], ...]
  vocabulary_sizes: tuple[int, ...]
  epsilon: float

  @property
  def kept_buckets(self) -> list[Optional[list[int]]]:
    return [None if r is None else r.kept_buckets.numpy().tolist() for r in self.remappings]

  def apply(self, ids):
    """``ids[:, t]`` of table ``t`` remapped into its preselected vocabulary.

    NumPy in, NumPy out; a tensor (e.g. inside ``tf.data``) in, a tensor out.
    """
    tensor = tf.convert_to_tensor(ids)
    if tensor.shape.rank != 2 or tensor.shape[1] != len(self.remappings):
      raise ValueError(f"ids must have shape [examples, {len(self.remappings)}], "
                       f"got {tensor.shape}")
    remapped = tf.stack([tensor[:, t] if remapping is None else remapping(tensor[:, t])
                         for t, remapping in enumerate(self.remappings)], axis=1)
    return remapped if tf.is_tensor(ids) else remapped.numpy()


def preselect_buckets(counts: Sequence, k: int, epsilon: float, seed) -> Preselection:
  """``k`` buckets per table from ``counts[t]`` (distinct examples per bucket).

  ``seed`` is a stateless seed (shape ``[2]``); table ``t`` uses ``fold_in(seed, t)``.
  """
  if not isinstance(k, int) or k < 1:
    raise ValueError(f"k (buckets kept per table) must be an integer >= 1, got {k!r}")
  sizes = [int(np.shape(c)[-1]) for c in counts]
  selected = [t for t, size in enumerate(sizes) if size > k]
  if selected:
    check_positive("selection epsilon", epsilon)
  seed = tf.convert_to_tensor(seed, tf.int64)
  remappings = []
  for t, table_counts in enumerate(counts):
    if t not in selected:
      remappings.append(None)
      continue
    table_seed = seeds.fold_in(seed, t)
    remappings.append(BucketRemapping(dp_top_k(table_counts, k, epsilon / len(selected),
                                               table_seed)))
  return Preselection(tuple(remappings),
                      tuple(size if r is None else r.vocabulary_size
                            for size, r in zip(sizes, remappings)),
                      epsilon if selected else 0.0)
