"""Standard normal draws that are the same numbers with and without XLA.

The Gaussian noise of every mechanism (``sigma2 C2`` on selected rows, ``sigma C2``
on dense weights and DP-SGD's tables; Ghazi et al., NeurIPS 2023, Algorithm 1, line 9) is drawn
here rather than by ``tf.random.stateless_normal``, for two properties a
compiled DP step (``jit_compile=True``, every TPU program) needs:

* **Same numbers under XLA.** TensorFlow's stateless ops give the same random
  *words* in graph mode and under XLA (one Philox stream per seed), but convert
  them to floats differently: ``stateless_normal`` of one seed differs between
  the two. The conversion below is ours, so a step compiled with XLA adds the
  noise graph mode adds for the same seed, to float rounding.
* **Prefix-stable.** Element ``k`` of a draw depends only on the 64-bit word
  ``floor(k/2)`` of the seed's stream, so a draw of shape ``[m, d]``
  is the first ``m`` rows of a draw of shape ``[M, d]`` for any ``M >= m`` (to
  float rounding): a buffer padded to a static capacity holds the noise an
  exact-size buffer would.

The conversion is Box-Muller on the two 32-bit halves ``a, b`` of one word:
``U1 = (a + 1/2) 2^-32``, ``U2 = (b + 1/2) 2^-32``, ``R = sqrt(-2 log U1)``,
``(R cos 2 pi U2, R sin 2 pi U2)``, in float32 as TensorFlow's own
``stateless_normal`` does (its magnitude is at most ``sqrt(2 * 32 log 2) ~ 6.66``
standard deviations). As for any floating-point Gaussian mechanism (Mironov,
"On Significance of the Least Significant Bits for Differential Privacy",
CCS 2012), the draw follows the exact law only to within its rounding.
"""

from __future__ import annotations

import math

import tensorflow as tf

from sparse_dp.mechanisms.randomness.seeds import portable


def standard_normal(shape, seed: tf.Tensor, dtype=tf.float32) -> tf.Tensor:
  """``N(0, 1)`` samples of ``shape`` from a ``[2]`` stateless seed (see the module doc)."""
  shape = tf.cast(shape, tf.int64)
  count = tf.reduce_prod(shape)
  pairs = (count + 1) // 2
  words = tf.random.stateless_uniform(pairs[None], portable(seed), minval=None, maxval=None,
                                      dtype=tf.uint64)
  high = tf.bitwise.right_shift(words, tf.constant(32, tf.uint64))
  low = tf.bitwise.bitwise_and(words, tf.constant(0xFFFFFFFF, tf.uint64))
  radius = tf.sqrt(-2.0 * tf.math.log(_uniform(high)))
  angle = (2.0 * math.pi) * _uniform(low)
  normal = tf.reshape(tf.stack([radius * tf.cos(angle), radius * tf.sin(angle)], axis=1), [-1])
  return tf.cast(tf.reshape(normal[:count], shape), dtype)


def _uniform(half_words: tf.Tensor) -> tf.Tensor:
  """``(a + 1/2) 2^-32`` in ``(0, 1]`` for 32-bit values ``a`` held as uint64."""
  return (tf.cast(half_words, tf.float32) + 0.5) * 2.0 ** -32
