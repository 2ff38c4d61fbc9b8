"""Stateless seeds that draw the same numbers with and without XLA.

TensorFlow's stateless random ops key their generator with the two int64
components of a ``[2]`` seed. Graph mode reads all 64 bits of each component,
XLA (``jit_compile=True``, a TPU program) only the low 32: a seed with a
component outside ``[0, 2^32)`` draws different numbers in the two, and
``stateless_split``/``stateless_fold_in`` return such seeds most of the time.
Every seed of a DP step passes through :func:`portable` before it keys a draw
(here, and in :mod:`~sparse_dp.mechanisms.randomness.exponential` and
:mod:`~sparse_dp.mechanisms.randomness.gaussian`): each component folded to 32 bits as
``(s XOR (s >> 32)) mod 2^32``, so the key keeps both halves' entropy (64 bits
in all) and graph mode and XLA draw alike.
"""

from __future__ import annotations

import tensorflow as tf

_LOW_32 = 0xFFFFFFFF


def portable(seed: tf.Tensor) -> tf.Tensor:
  """Folds each component of a seed into ``[0, 2^32)``, so graph mode and XLA draw alike.

  Each component ``s`` becomes ``(s XOR (s >> 32)) mod 2^32``.
  The key then keeps both halves' entropy, 64 bits in all.

  Args:
    seed: int ``[2]`` stateless seed.

  Returns:
    int64 ``[2]``, each component in ``[0, 2^32)``.
  """
  seed = tf.cast(seed, tf.int64)
  folded = tf.bitwise.bitwise_xor(seed, tf.bitwise.right_shift(seed, tf.constant(32, tf.int64)))
  return tf.bitwise.bitwise_and(folded, tf.constant(_LOW_32, tf.int64))


def split(seed: tf.Tensor, count: int) -> list:
  """Makes ``count`` independent seeds from one (``stateless_split`` of the portable seed).

  Args:
    seed: int ``[2]`` stateless seed.
    count: the number of seeds.

  Returns:
    A list of ``count`` int64 ``[2]`` seeds.
  """
  return tf.unstack(tf.random.experimental.stateless_split(portable(seed), count))


def fold_in(seed: tf.Tensor, data) -> tf.Tensor:
  """The seed of ``data`` under ``seed`` (``stateless_fold_in`` of the portable seed).

  Args:
    seed: int ``[2]`` stateless seed.
    data (int | tf.Tensor): an int scalar, e.g. a step number.

  Returns:
    An int64 ``[2]`` seed.
  """
  return tf.random.experimental.stateless_fold_in(portable(seed), data)
