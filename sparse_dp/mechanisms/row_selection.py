"""Noisy thresholding of the contribution map (core paper Algorithm 1, lines 6-8).

A row ``j`` survives when ``V_hat[j] + N(0, (sigma1 C1)^2) >= tau``. Rows with
``V_hat[j] > 0`` are few and are noised one by one. The other ``c'`` rows of the
vocabulary all have ``V_hat[j] = 0`` and each survives independently with
``p = Psi(tau / (sigma1 C1))`` (App. B.2, with the denominator corrected from
``sigma1^2 C1^2`` to the noise's standard deviation, ``../shared/NOTES.md`` §2),
where ``Psi`` is the standard normal survival function. Their positions are
drawn by geometric skips: the gap between consecutive survivors is
``Geometric(p)``, so the work is proportional to the number selected, never to
the vocabulary.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from sparse_dp.mechanisms.contribution_map import ContributionMap

# Over-provisioning of one batch of geometric gaps, in standard deviations of
# the Binomial count; a second batch is drawn only if this one falls short.
_CHUNK_SIGMAS = 6.0
_TINY = float(np.finfo(np.float64).tiny)  # keeps log(U) finite


class RowSelection(NamedTuple):
  """Rows of one table that receive a (noisy) gradient this step."""

  rows: tf.Tensor  # int64 [m], sorted, distinct: true and false positives
  num_true_positives: tf.Tensor  # int64: contributed rows that passed tau
  num_dropped: tf.Tensor  # int64: contributed rows that did not pass tau
  num_false_positives: tf.Tensor  # int64: zero-contribution rows that passed tau


def false_positive_probability(threshold: float, noise_stddev: float) -> float:
  """``Psi(tau / (sigma1 C1))``: chance that a zero-contribution row survives."""
  if noise_stddev <= 0:
    raise ValueError(f"contribution-map noise std (sigma1 * C1) must be > 0, got {noise_stddev}")
  return 0.5 * math.erfc(threshold / noise_stddev / math.sqrt(2.0))


def select_rows(contribution: ContributionMap, vocabulary_size: int,
                threshold: float, noise_stddev: float, seed: tf.Tensor) -> RowSelection:
  """Rows whose noisy contribution ``V_hat + N(0, noise_stddev^2)`` is ``>= threshold``.

  Args:
    contribution: the table's clipped contribution map.
    vocabulary_size: number of rows ``c`` of the table.
    threshold: ``tau``; must be > 0, else most of the vocabulary is selected.
    noise_stddev: ``sigma1 * C1``.
    seed: shape ``[2]`` integer seed of the stateless random ops.
  """
  if not threshold > 0:
    raise ValueError(f"threshold tau must be > 0 (got {threshold}): at tau <= 0 at "
                     "least half of all zero-contribution rows would be selected")
  contributed_seed, zero_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  noisy = contribution.values + tf.random.stateless_normal(
      tf.shape(contribution.values), contributed_seed, stddev=noise_stddev)
  passed = noisy >= threshold
  true_positives = tf.boolean_mask(contribution.rows, passed)
  false_positives = sample_zero_rows(
      contribution.rows, vocabulary_size,
      false_positive_probability(threshold, noise_stddev), zero_seed)
  rows = tf.sort(tf.concat([true_positives, false_positives], axis=0))
  num_true = tf.size(true_positives, out_type=tf.int64)
  return RowSelection(rows, num_true,
                      tf.size(contribution.rows, out_type=tf.int64) - num_true,
                      tf.size(false_positives, out_type=tf.int64))


def sample_zero_rows(excluded_rows: tf.Tensor, vocabulary_size: int,
                     probability: float, seed: tf.Tensor) -> tf.Tensor:
  """Each row of ``[0, vocabulary_size)`` not in ``excluded_rows``, kept w.p. ``probability``.

  ``excluded_rows`` must be sorted and distinct. Returns sorted int64 rows.
  """
  excluded_rows = tf.cast(excluded_rows, tf.int64)
  num_zero_rows = tf.cast(vocabulary_size, tf.int64) - tf.size(excluded_rows, out_type=tf.int64)
  positions = bernoulli_positions(num_zero_rows, probability, seed)
  # The z-th row absent from `excluded_rows` is z plus the number of excluded
  # rows r_k with r_k - k <= z.
  shifted = excluded_rows - tf.range(tf.size(excluded_rows, out_type=tf.int64))
  return positions + tf.searchsorted(shifted, positions, side="right", out_type=tf.int64)


def bernoulli_positions(length: tf.Tensor, probability: float,
                        seed: tf.Tensor) -> tf.Tensor:
  """Sorted positions in ``[0, length)``, each present independently w.p. ``probability``.

  Gaps between consecutive positions are ``Geometric(p)`` on ``{1, 2, ...}``,
  drawn as ``floor(log U / log(1 - p)) + 1``. Gaps are drawn in batches sized
  for the expected count ``length * p`` plus ``6`` standard deviations, so one
  batch almost always suffices; time and memory are O(positions).
  """
  if not 0 <= probability < 1:
    raise ValueError(f"selection probability must be in [0, 1), got {probability}")
  length = tf.cast(length, tf.float64)
  if probability == 0:
    return tf.zeros([0], tf.int64)
  log_keep_out = math.log1p(-probability)
  mean = length * probability
  chunk = tf.cast(tf.math.ceil(
      mean + _CHUNK_SIGMAS * tf.sqrt(mean * (1 - probability)) + 16.0), tf.int32)

  def draw(index, start, found):
    uniform = tf.random.stateless_uniform(
        [chunk], tf.random.experimental.stateless_fold_in(seed, index),
        minval=_TINY, maxval=1.0, dtype=tf.float64)
    gaps = tf.floor(tf.math.log(uniform) / log_keep_out) + 1.0
    positions = start + tf.cumsum(gaps) - 1.0
    return index + 1, positions[-1] + 1.0, found.write(index, positions)

  none_yet = tf.TensorArray(tf.float64, size=1, dynamic_size=True, infer_shape=False,
                            element_shape=tf.TensorShape([None])).write(0, tf.zeros([0], tf.float64))
  _, _, found = tf.while_loop(lambda index, start, found: start < length, draw,
                              (tf.constant(1), tf.constant(0.0, tf.float64), none_yet))
  positions = found.concat()
  return tf.cast(tf.boolean_mask(positions, positions < length), tf.int64)
