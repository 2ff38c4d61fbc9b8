"""sparse_dp.mechanisms.randomness: the Philox words every draw is made from."""

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp.mechanisms.randomness.exponential import standard_exponential
from sparse_dp.mechanisms.randomness.gaussian import standard_normal
from sparse_dp.mechanisms.randomness.seeds import philox_words, portable

SEEDS = [[0, 0], [1, 2], [2**32 - 1, 12345], [-7, 2**62 + 3], [-(2**63), 2**63 - 1]]


def _runs(fn):
  """``fn`` eagerly, traced, and compiled by XLA."""
  return [fn, tf.function(fn), tf.function(fn, jit_compile=True)]


@pytest.mark.parametrize("shape", [[0], [5], [3, 4]])
@pytest.mark.parametrize("seed", SEEDS)
def test_words_are_tensorflows_philox_stream_of_the_portable_seed(seed, shape):
  seed = tf.constant(seed, tf.int64)
  expected = tf.random.stateless_uniform(shape, portable(seed), minval=None, maxval=None,
                                         dtype=tf.uint64, alg="philox").numpy()
  for dtype in (tf.int64, tf.int32):  # the callers pass tf.shape's int32 too
    for run in _runs(lambda s: philox_words(tf.constant(shape, dtype), s)):
      np.testing.assert_array_equal(run(seed).numpy(), expected)


@pytest.mark.parametrize("seed", SEEDS[1:3])
def test_normal_and_exponential_draws_are_the_same_numbers_with_and_without_xla(seed):
  seed = tf.constant(seed, tf.int64)
  for draw in (lambda s: standard_normal([7, 3], s), lambda s: standard_exponential([9], s)):
    eager, traced, compiled = (run(seed).numpy() for run in _runs(draw))
    np.testing.assert_array_equal(traced, eager)
    np.testing.assert_allclose(compiled, eager, rtol=1e-6)
