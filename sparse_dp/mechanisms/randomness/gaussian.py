"""Standard normal draws that are the same numbers with and without XLA.

The Gaussian noise of every mechanism (``sigma2 C2`` on selected rows, ``sigma C2`` on dense
weights and DP-SGD's tables; Ghazi et al., NeurIPS 2023, Algorithm 1, line 9) is drawn here
from the raw 64-bit words of TensorFlow's stateless Philox stream (asked for by name: on a TPU
XLA's default generator is another), which graph mode and XLA share, rather than by
``tf.random.stateless_normal``, which converts them differently in the two. The conversion is
Box-Muller on the two 32-bit halves ``a, b`` of one word:
``U1 = (a + 1/2) 2^-32``, ``U2 = (b + 1/2) 2^-32``, ``R = sqrt(-2 log U1)``,
``(R cos 2 pi U2, R sin 2 pi U2)``, in float32. Element ``k`` depends only on word
``floor(k/2)``, so a draw of shape ``[m, d]`` is the first ``m`` rows of one of shape
``[M, d]`` (prefix-stable: a buffer padded to a static capacity holds the noise an exact-size
buffer would). See docs/reference/mechanisms.md ("How the draws are made").
"""

from __future__ import annotations

import math

import tensorflow as tf

from sparse_dp.mechanisms.randomness.seeds import philox_words


def standard_normal(shape, seed: tf.Tensor, dtype=tf.float32) -> tf.Tensor:
  """``N(0, 1)`` samples that are the same numbers with and without XLA.

  They are the noise of every mechanism (Algorithm 1, line 9).
  They are drawn from the raw 64-bit words of TensorFlow's stateless Philox stream, which graph
  mode and XLA share.
  Each word's 32-bit halves ``a, b`` give ``U1 = (a + 1/2) 2^-32`` and ``U2 = (b + 1/2) 2^-32``.
  Box-Muller then gives ``(R cos 2 pi U2, R sin 2 pi U2)`` with ``R = sqrt(-2 log U1)``, in
  float32.
  Element ``k`` depends only on word ``floor(k/2)``, so the draws are prefix-stable.
  A draw of shape ``[m, d]`` is the first ``m`` rows of one of shape ``[M, d]``.
  See docs/reference/mechanisms.md ("How the draws are made").

  Args:
    shape (Sequence[int] | tf.Tensor): the samples' shape, an int vector.
    seed: shape ``[2]`` stateless seed.
    dtype (tf.DType): the samples' dtype; they are computed in float32.

  Returns:
    A tensor of ``shape`` and ``dtype``.
  """
  shape = tf.cast(shape, tf.int64)
  count = tf.reduce_prod(shape)
  pairs = (count + 1) // 2
  words = philox_words(pairs[None], seed)
  high = tf.bitwise.right_shift(words, tf.constant(32, tf.uint64))
  low = tf.bitwise.bitwise_and(words, tf.constant(0xFFFFFFFF, tf.uint64))
  radius = tf.sqrt(-2.0 * tf.math.log(_uniform(high)))
  angle = (2.0 * math.pi) * _uniform(low)
  normal = tf.reshape(tf.stack([radius * tf.cos(angle), radius * tf.sin(angle)], axis=1), [-1])
  return tf.cast(tf.reshape(normal[:count], shape), dtype)


def _uniform(half_words: tf.Tensor) -> tf.Tensor:
  """``(a + 1/2) 2^-32`` in ``(0, 1]`` for 32-bit values ``a`` held as uint64."""
  return (tf.cast(half_words, tf.float32) + 0.5) * 2.0 ** -32
