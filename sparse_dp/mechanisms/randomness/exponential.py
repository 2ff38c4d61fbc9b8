"""Standard exponential samples exact in both tails, from 64 random bits.

Gumbel top-k (App. B.1: ``G = -log E``), the noisy threshold (App. B.2: a row passes w.p.
``Psi(x) = P(E >= -log Psi(x))``) and the geometric skips between false positives
(``floor(E / -log(1 - p))``) all reduce to ``E ~ Exp(1)``, and their privacy rests on its
tails. ``E = -log U`` for ``U = (k + 1/2) 2^-64``, ``k`` uniform on ``[0, 2^64)``, computed
from whichever of ``U`` and ``1 - U`` is smaller (``-log U`` when ``U < 1/2``,
``-log1p(-(1 - U))`` otherwise), so ``P(E >= a)`` equals ``e^-a`` to within ``2^-64`` for
every ``a`` and ``E`` ranges over ``[2.7e-20, 45.06]``. Each draw is within total variation
~``2^-64`` of the exact law (Mironov, CCS 2012). See docs/reference/mechanisms.md ("How the
draws are made").
"""

from __future__ import annotations

import tensorflow as tf

from sparse_dp.mechanisms.randomness.seeds import philox_words

_HALF = 2 ** 63  # k >= 2^63 means U >= 1/2


def standard_exponential(shape, seed: tf.Tensor) -> tf.Tensor:
  """float64 ``Exp(1)`` samples of ``shape`` from a ``[2]`` stateless seed."""
  return exponential_from_bits(philox_words(shape, seed))


def exponential_from_bits(bits: tf.Tensor) -> tf.Tensor:
  """``-log U`` for ``U = (bits + 1/2) 2^-64``; ``bits`` uint64, result float64."""
  upper_half = bits >= tf.constant(_HALF, tf.uint64)
  # 2^64 - bits - 1/2 = ~bits + 1/2, so the distance to the nearer end of
  # [0, 1] is (min(bits, ~bits) + 1/2) 2^-64, held with full precision.
  nearer = tf.where(upper_half, tf.bitwise.invert(bits), bits)
  distance = (tf.cast(nearer, tf.float64) + 0.5) * 2.0 ** -64
  return tf.where(upper_half, -tf.math.log1p(-distance), -tf.math.log(distance))
