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
  """The nonzero entries of one table's contribution map: ``values[i] = V_hat[rows[i]]``.

  Attributes:
    rows: int64 ``[n]``, a padded row list (:mod:`sparse_dp.mechanisms.rows.padding`) as long as
      the table's activated pairs: sorted, distinct, then ``PAD``.
    values: float32 ``[n]``, ``> 0`` on the rows and 0 on the padding.
  """

  rows: tf.Tensor  # int64 [n]: sorted, distinct, then PAD
  values: tf.Tensor  # float32 [n]: > 0, then 0


def contribution_clip_weights(per_table: Sequence[Activations],
                              clip_norm: float) -> tf.Tensor:
  """Each example's contribution clipping factor ``min(1, C1 / sqrt(n_i))``.

  ``n_i`` is example ``i``'s number of distinct activated ``(table, row)`` pairs, over all tables.
  Its contribution vector ``v_i`` has norm ``||v_i||_2 = sqrt(n_i)``.

  Args:
    per_table: each table's distinct activated pairs in one batch.
    clip_norm: ``C1``.

  Returns:
    float32 ``[B]``.
  """
  batch_size = per_table[0].batch_size
  counts = tf.add_n([
      tf.math.unsorted_segment_sum(tf.cast(padding.is_valid(a.row), tf.float32), a.example,
                                   batch_size) for a in per_table
  ])
  norms = tf.sqrt(tf.maximum(counts, 1.0))
  return tf.minimum(1.0, tf.cast(clip_norm, tf.float32) / norms)


def contribution_maps(ids_per_table: Sequence[Ids],
                      clip_norm: float) -> list[ContributionMap]:
  """The contribution map ``V_hat`` of every table for one batch (Algorithm 1, line 6).

  Example ``i``'s contribution vector ``v_i`` is the indicator of every ``(table, row)`` it
  activates, across all tables.
  It is clipped jointly to ``C1``: ``[v_i]_C1 = v_i * min(1, C1 / sqrt(n_i))``.
  The map is ``V_hat = sum_i [v_i]_C1``, kept sparse per table.
  Adding or removing one example changes ``V_hat`` by at most ``C1`` in L2 norm.

  Args:
    ids_per_table: ``ids_per_table[t]`` are the ids looked up in table ``t``, in any layout
      :func:`~sparse_dp.mechanisms.activations` takes. Several features sharing one table
      should be concatenated along the id axis first, so that a row activated by two of them
      counts once.
    clip_norm: ``C1``.

  Returns:
    A list with one :class:`ContributionMap` per table.

  Raises:
    ValueError: ``ids_per_table`` is empty, or ids of a layout that is not supported.
  """
  if not ids_per_table:
    raise ValueError("contribution_maps needs the ids of at least one table")
  return clipped_contribution_maps([activations(ids) for ids in ids_per_table], clip_norm)


def clipped_contribution_maps(per_table: Sequence[Activations],
                              clip_norm: float) -> list[ContributionMap]:
  """:func:`contribution_maps` from each table's distinct activated pairs.

  Args:
    per_table: each table's :class:`~sparse_dp.mechanisms.Activations` in one batch.
    clip_norm: ``C1``.

  Returns:
    A list with one :class:`ContributionMap` per table, as long as the table's activated
      pairs.
  """
  weights = contribution_clip_weights(per_table, clip_norm)
  # Activations.row is sorted by construction: no sort to find its distinct rows.
  return [ContributionMap(*padding.sum_by_row(
              a.row, padding.mask_rows(tf.gather(weights, a.example), padding.is_valid(a.row)),
              is_sorted=True))
          for a in per_table]
