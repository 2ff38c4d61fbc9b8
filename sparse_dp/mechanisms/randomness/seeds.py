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
_PHILOX = tf.random.Algorithm.PHILOX.value
_SCRAMBLE_KEY = 0x02461E293EC8F720  # TensorFlow's key for turning a seed into Philox's


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


def philox_words(shape, seed: tf.Tensor) -> tf.Tensor:
  """Raw uint64 words of TensorFlow's stateless Philox stream of :func:`portable` ``(seed)``.

  They are ``tf.random.stateless_uniform(shape, portable(seed), minval=None, maxval=None,
  dtype=tf.uint64, alg="philox")``, the same numbers with and without XLA (Philox asked
  for by name: on a TPU XLA's default generator is another). The seed becomes Philox's key
  and counter as TensorFlow scrambles it: the first two words of the stream keyed by
  ``0x02461E293EC8F720`` at counter ``seed`` give ``key = [w0]``, ``counter = [0, w1]``,
  drawn here as two uint64 words: a draw has 28 graph nodes fewer than TensorFlow's, which
  draws four 32-bit halves and joins them.

  Args:
    shape (Sequence[int] | tf.Tensor): the words' shape, an int vector.
    seed: int ``[2]`` stateless seed.

  Returns:
    uint64 words of ``shape``.
  """
  mixed = tf.raw_ops.StatelessRandomUniformFullIntV2(
      shape=[2], key=tf.constant([_SCRAMBLE_KEY], tf.uint64),
      counter=tf.cast(portable(seed), tf.uint64), alg=_PHILOX, dtype=tf.uint64)
  return tf.raw_ops.StatelessRandomUniformFullIntV2(
      shape=shape, key=mixed[:1], counter=tf.pad(mixed[1:], [[1, 0]]), alg=_PHILOX,
      dtype=tf.uint64)


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
