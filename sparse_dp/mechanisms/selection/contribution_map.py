"""The clipped contribution map of DP-AdaFEST (Ghazi et al., NeurIPS 2023, Algorithm 1, line 6).

Example ``i``'s contribution vector ``v_i`` is the indicator of every
``(table, row)`` it activates, across all tables (Fig. 2), so
``||v_i||_2 = sqrt(n_i)`` with ``n_i`` its number of distinct activated pairs.
It is clipped jointly to ``C1``: ``[v_i]_C1 = v_i * min(1, C1 / sqrt(n_i))``,
and the batch's contribution map is ``V_hat = sum_i [v_i]_C1``, kept sparse as
the rows with nonzero value, per table. Adding or removing one example changes
``V_hat`` by at most ``C1`` in L2 norm, which is what the noise
``N(0, (sigma1 C1)^2)`` of :func:`sparse_dp.mechanisms.select_rows` protects.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import tensorflow as tf

from sparse_dp.mechanisms.rows import padding
from sparse_dp.mechanisms.rows.activations import Activations, Ids, activations


class ContributionMap(NamedTuple):
  """Nonzero entries of one table's ``V_hat``: ``values[i] = V_hat[rows[i]]``.

  ``rows`` is a padded row list (:mod:`sparse_dp.mechanisms.rows.padding`) as long
  as the table's activated pairs; the padding has value 0.
  """

  rows: tf.Tensor  # int64 [n]: sorted, distinct, then PAD
  values: tf.Tensor  # float32 [n]: > 0, then 0


def contribution_clip_weights(per_table: Sequence[Activations],
                              clip_norm: float) -> tf.Tensor:
  """``min(1, C1 / sqrt(n_i))`` for every example ``i`` of the batch, float32 [B]."""
  batch_size = per_table[0].batch_size
  counts = tf.add_n([
      tf.math.unsorted_segment_sum(tf.cast(padding.is_valid(a.row), tf.float32), a.example,
                                   batch_size) for a in per_table
  ])
  norms = tf.sqrt(tf.maximum(counts, 1.0))
  return tf.minimum(1.0, tf.cast(clip_norm, tf.float32) / norms)


def contribution_maps(ids_per_table: Sequence[Ids],
                      clip_norm: float) -> list[ContributionMap]:
  """``V_hat`` of every table for one batch, contributions clipped jointly to ``C1``.

  ``ids_per_table[t]`` are the ids looked up in table ``t``; several features
  sharing one table should be concatenated along the id axis first so that a
  row activated by two of them counts once.
  """
  if not ids_per_table:
    raise ValueError("contribution_maps needs the ids of at least one table")
  return clipped_contribution_maps([activations(ids) for ids in ids_per_table], clip_norm)


def clipped_contribution_maps(per_table: Sequence[Activations],
                              clip_norm: float) -> list[ContributionMap]:
  """:func:`contribution_maps` from each table's distinct activated pairs."""
  weights = contribution_clip_weights(per_table, clip_norm)
  return [_sum_by_row(a.row, padding.mask_rows(tf.gather(weights, a.example),
                                               padding.is_valid(a.row)))
          for a in per_table]


def _sum_by_row(rows: tf.Tensor, values: tf.Tensor) -> ContributionMap:
  unique = padding.padded_unique(rows)
  summed = tf.math.unsorted_segment_sum(values, unique.slot, tf.size(rows, out_type=tf.int64))
  return ContributionMap(unique.values, summed)
