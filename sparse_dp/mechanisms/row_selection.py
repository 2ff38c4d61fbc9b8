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

Both draws are exact in the tails. A contributed row passes w.p.
``Psi(x_j)``, ``x_j = (tau - V_hat[j]) / (sigma1 C1)``, decided as
``E_j >= -log Psi(x_j)`` with ``E_j ~ Exp(1)`` from 64 random bits
(:mod:`sparse_dp.mechanisms.exponential`) and ``-log Psi`` computed in
float64 from ``erfc`` on whichever side keeps full precision: the pass
probability is ``Psi(x_j)`` to within ``2^-64`` for every ``x_j`` (a float32
Gaussian draw, by contrast, never exceeds ~5.7 standard deviations). The noisy
value ``V_hat[j] + N(0, (sigma1 C1)^2)`` itself is never needed, nor released.
The geometric gaps are ``floor(E / -log(1 - p)) + 1`` with the same ``E``, so
zero-contribution rows are selected at ``Psi(tau / (sigma1 C1))`` to the same
precision; ``p`` underflows to 0 only past ``tau > 38 sigma1 C1``, where it is
below 1e-308.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import tensorflow as tf

from sparse_dp.mechanisms.contribution_map import ContributionMap
from sparse_dp.mechanisms.exponential import standard_exponential

# Over-provisioning of one batch of geometric gaps, in standard deviations of
# the Binomial count; a second batch is drawn only if this one falls short.
_CHUNK_SIGMAS = 6.0
# Most positions one call may return (16 GiB of int64): beyond it the expected
# count of a Bernoulli sample is refused rather than allocated.
MAX_POSITIONS = 2 ** 31
# Positions are float64 sums of gaps, exact integers below 2^53.
_MAX_LENGTH = 2 ** 53


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


def negative_log_survival(x: tf.Tensor) -> tf.Tensor:
  """``-log Psi(x)`` in float64, accurate in both tails.

  ``-log(erfc(x / sqrt 2) / 2)`` for ``x >= 0`` (``inf`` once ``Psi`` underflows,
  past ``x ~ 38``) and ``-log1p(-erfc(-x / sqrt 2) / 2)`` for ``x < 0``, where
  ``Psi(x) = 1 - Psi(-x)`` is near 1.
  """
  x = tf.cast(x, tf.float64)
  root2 = math.sqrt(2.0)
  return tf.where(x >= 0, -tf.math.log(0.5 * tf.math.erfc(x / root2)),
                  -tf.math.log1p(-0.5 * tf.math.erfc(-x / root2)))


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
  probability = false_positive_probability(threshold, noise_stddev)
  if vocabulary_size * probability > MAX_POSITIONS:
    raise ValueError(
        f"threshold tau = {threshold:g} is only {threshold / noise_stddev:.3g} times the "
        f"contribution map's noise (sigma1 C1 = {noise_stddev:g}): about "
        f"{vocabulary_size * probability:.3g} of the {vocabulary_size:,} rows would pass "
        f"it by noise alone each step, more than the {MAX_POSITIONS:,} rows a step can "
        "hold; raise tau (DPConfig(threshold_sigmas=...))")
  contributed_seed, zero_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  gap = (threshold - tf.cast(contribution.values, tf.float64)) / noise_stddev
  passed = (standard_exponential(tf.shape(gap), contributed_seed)
            >= negative_log_survival(gap))
  true_positives = tf.boolean_mask(contribution.rows, passed)
  false_positives = sample_zero_rows(contribution.rows, vocabulary_size, probability,
                                     zero_seed)
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
  drawn as ``floor(E / -log(1 - p)) + 1`` with ``E ~ Exp(1)``. Gaps are drawn in
  batches (int64-sized) for the expected count ``length * p`` plus ``6``
  standard deviations, so one batch almost always suffices; time and memory
  are O(positions). ``p = 1`` gives every position. An expected count above
  :data:`MAX_POSITIONS`, or ``length > 2^53``, is refused.
  """
  if not 0 <= probability <= 1:
    raise ValueError(f"selection probability must be in [0, 1], got {probability}")
  length = _checked_size(length, probability)
  if probability == 0:
    return tf.zeros([0], tf.int64)
  if probability == 1:
    return tf.range(tf.cast(length, tf.int64))
  log_keep_out = -math.log1p(-probability)
  chunk = gap_batch_size(length, probability)

  def draw(index, start, found):
    exponential = standard_exponential(
        tf.reshape(chunk, [1]), tf.random.experimental.stateless_fold_in(seed, index))
    gaps = tf.floor(exponential / log_keep_out) + 1.0
    positions = start + tf.cumsum(gaps) - 1.0
    return index + 1, positions[-1] + 1.0, found.write(index, positions)

  none_yet = tf.TensorArray(tf.float64, size=1, dynamic_size=True, infer_shape=False,
                            element_shape=tf.TensorShape([None])).write(0, tf.zeros([0], tf.float64))
  _, _, found = tf.while_loop(lambda index, start, found: start < length, draw,
                              (tf.constant(1), tf.constant(0.0, tf.float64), none_yet))
  positions = found.concat()
  return tf.cast(tf.boolean_mask(positions, positions < length), tf.int64)


def gap_batch_size(length: tf.Tensor, probability: float) -> tf.Tensor:
  """int64 number of gaps drawn at once: ``ceil(n p + 6 sqrt(n p (1 - p)) + 16)``."""
  mean = tf.cast(length, tf.float64) * probability
  return tf.cast(tf.math.ceil(
      mean + _CHUNK_SIGMAS * tf.sqrt(mean * (1 - probability)) + 16.0), tf.int64)


def _checked_size(length: tf.Tensor, probability: float) -> tf.Tensor:
  """float64 ``length``; refuses a sample that would not fit: now if ``length`` is
  known, else when run, before anything is drawn (the draws depend on the check)."""
  length = tf.cast(length, tf.float64)
  message = (f"bernoulli_positions(length, probability={probability:g}): length x "
             f"probability expects more than {MAX_POSITIONS:,} positions, or length "
             "exceeds 2^53; sample a shorter range or a smaller probability")
  static = tf.get_static_value(length)
  if static is not None:
    if static * probability > MAX_POSITIONS or static > _MAX_LENGTH:
      raise ValueError(f"{message} (length {static:.6g}, expected "
                       f"{static * probability:.6g} positions)")
    return length
  checks = [tf.debugging.assert_less_equal(
                length * probability, tf.constant(MAX_POSITIONS, tf.float64), message=message),
            tf.debugging.assert_less_equal(
                length, tf.constant(_MAX_LENGTH, tf.float64), message=message)]
  with tf.control_dependencies(checks):
    return tf.identity(length)
