"""DP-FEST's bucket preselection (Ghazi et al., NeurIPS 2023, §3.1, App. B.1, Algorithm 2).

``dp_top_k`` adds Gumbel noise of scale ``b = k / epsilon`` to each bucket's
count of distinct examples and keeps the ``k`` largest: ``epsilon``-DP (see
:mod:`sparse_dp.accounting.selection` for why the scale is ``k / epsilon``, not
the paper's ``1 / epsilon``). The Gumbel noise is ``-log E`` for ``E ~ Exp(1)``
exact in both tails (:mod:`sparse_dp.mechanisms.randomness.exponential`): support
``[-3.81, 45.05]`` times ``b``, cut only where the mass is below ``2^-65``.
A float32 uniform on ``[1e-30, 1)`` would cap the noise at ``15.9 b``, so a
bucket ``20 b`` behind another could never win, and Gumbel-max would not be
the exponential mechanism there. ``public_top_k`` keeps the ``k`` most frequent
buckets of counts that are public (e.g. from a public corpus) at no privacy
cost.
"""

from __future__ import annotations

import tensorflow as tf

from sparse_dp.accounting.algorithms import check_positive
from sparse_dp.mechanisms.randomness.exponential import standard_exponential
from sparse_dp.mechanisms.rows import padding
from sparse_dp.mechanisms.rows.activations import Ids, activations


def bucket_counts(ids: Ids, vocabulary_size: int) -> tf.Tensor:
  """The number of distinct examples that activate each bucket.

  An example counts once per bucket, however often it repeats the id.
  So one example moves each count by at most 1, the sensitivity :func:`dp_top_k` assumes.

  Args:
    ids: one feature's ids, in any layout :func:`~sparse_dp.mechanisms.activations` takes.
    vocabulary_size: the number of buckets.

  Returns:
    float32 ``[vocabulary_size]``.

  Raises:
    ValueError: ids of a layout that is not supported.
    tf.errors.InvalidArgumentError: a bucket id that is negative or outside the vocabulary.
  """
  rows = activations(ids).row
  valid, rows = padding.is_valid(rows), padding.safe_rows(rows)
  # The message only, never the ids (private data): the assert runs before the sum,
  # whose own error would print the id.
  check = tf.debugging.Assert(tf.reduce_all(rows < tf.cast(vocabulary_size, tf.int64)), [
      f"bucket ids outside the vocabulary [0, {vocabulary_size}) (not printed: ids are "
      "private data); map them into [0, vocabulary_size) first (hash or bucket them)"])
  with tf.control_dependencies([check]):
    rows = tf.identity(rows)
  return tf.math.unsorted_segment_sum(tf.cast(valid, tf.float32), rows, vocabulary_size)


def dp_top_k(counts: tf.Tensor, k: int, epsilon: float, seed: tf.Tensor) -> tf.Tensor:
  """Chooses ``k`` buckets ``epsilon``-DP by one-shot Gumbel top-k (§3.1, App. B.1).

  Gumbel noise of scale ``b = k / epsilon`` is added to each count, and the ``k`` largest are
  kept.
  The scale is ``k / epsilon``, not the paper's ``1 / epsilon``
  (:mod:`sparse_dp.accounting.selection` says why).
  The noise is ``-b log E`` for ``E ~ Exp(1)`` exact in both tails.

  Args:
    counts: ``[..., vocabulary_size]``, each bucket's count of distinct examples
      (:func:`bucket_counts`). Leading axes are independent selections, each costing
      ``epsilon``.
    k: the number of buckets to keep, an integer in ``[1, vocabulary_size]``.
    epsilon: the privacy cost of each selection.
    seed: shape ``[2]`` integer seed.

  Returns:
    int64 ``[..., k]``, the chosen bucket ids, sorted.

  Raises:
    ValueError: ``epsilon`` is not a finite number > 0, or ``k`` is not an integer in
      ``[1, vocabulary_size]``.
  """
  check_positive("top-k epsilon", epsilon)
  counts = tf.cast(counts, tf.float64)
  return public_top_k(counts + gumbel_noise(tf.shape(counts), _check_k(k, counts) / epsilon,
                                            seed), k)


def gumbel_noise(shape, scale: float, seed: tf.Tensor) -> tf.Tensor:
  """float64 ``Gumbel(0, scale)`` samples: ``-scale log E``, ``E ~ Exp(1)``."""
  return -scale * tf.math.log(standard_exponential(shape, seed))


def public_top_k(counts: tf.Tensor, k: int) -> tf.Tensor:
  """The ``k`` largest of ``counts`` along the last axis, at no privacy cost.

  For counts that are public, e.g. from a public corpus.

  Args:
    counts: ``[..., vocabulary_size]``, each bucket's count.
    k: the number of buckets to keep, an integer in ``[1, vocabulary_size]``.

  Returns:
    int64 ``[..., k]``, the ids of the largest counts, sorted.

  Raises:
    ValueError: ``k`` is not an integer in ``[1, vocabulary_size]``.
  """
  counts = tf.convert_to_tensor(counts)
  _, top = tf.math.top_k(counts, k=_check_k(k, counts), sorted=False)
  return tf.sort(tf.cast(top, tf.int64))


def _check_k(k: int, counts: tf.Tensor) -> int:
  if not isinstance(k, int) or k < 1:
    raise ValueError(f"k must be an integer >= 1, got {k!r}")
  size = counts.shape[-1]
  if size is not None and k > size:
    raise ValueError(f"k = {k} exceeds the vocabulary of {size} buckets")
  return k
