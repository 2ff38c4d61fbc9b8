"""Fixed per-example noise for the separability probe's forward passes.

The probe compares example ``i``'s loss in a pass over ``n`` examples with its loss in a pass
without example ``k``; a random layer (``Dropout``, ``GaussianNoise``, any
``BaseRandomLayer``) would draw different noise in the two. During the probe each such layer's
``_random_generator`` is replaced by a :class:`FixedNoise` whose draw for example ``i`` is a
function of ``(layer, call number in the pass, i)`` alone (stateless RNG), ``i`` the example's
index in the probe. The passes then agree exactly when the model is separable; one fixed,
data-independent draw per example is a valid point to test the guarantee at. Randomness drawn
elsewhere (``tf.random.*`` in a ``call``) is not fixed: the probe sees it and refuses. See
docs/epsilon.md ("Each example alone").
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import tensorflow as tf

from sparse_dp._keras import keras

_RANDOM_GENERATOR = "_random_generator"

# Keys of one layer's calls within a pass: key = layer * _CALLS + call.
_CALLS = 1 << 16


class FixedNoise:
  """Stands in for one layer's ``RandomGenerator``; outside a probe pass it is the original."""

  def __init__(self, layer_index: int, original, passes: "FixedPasses"):
    self._layer_index = layer_index
    self._original = original
    self._passes = passes

  def random_uniform(self, shape, minval=0.0, maxval=None, dtype=None, nonce=None):
    return self._draw("random_uniform", tf.random.stateless_uniform, shape, dtype, nonce,
                      minval=minval, maxval=maxval)

  def random_normal(self, shape, mean=0.0, stddev=1.0, dtype=None, nonce=None):
    return self._draw("random_normal", tf.random.stateless_normal, shape, dtype, nonce,
                      mean=mean, stddev=stddev)

  def truncated_normal(self, shape, mean=0.0, stddev=1.0, dtype=None, nonce=None):
    return self._draw("truncated_normal", tf.random.stateless_truncated_normal, shape, dtype,
                      nonce, mean=mean, stddev=stddev)

  def dropout(self, inputs, rate, noise_shape=None):
    if self._passes.examples is None:
      return self._original.dropout(inputs, rate, noise_shape=noise_shape)
    return tf.nn.experimental.general_dropout(
        inputs, rate=rate, noise_shape=noise_shape,
        uniform_sampler=lambda shape, dtype: self.random_uniform(shape, dtype=dtype))

  def __getattr__(self, name):
    """Anything else (seeds for image layers, ...) is the original's: still random."""
    original = vars(self).get("_original")  # absent while copy or pickle rebuilds an instance
    if original is None:
      raise AttributeError(name)
    return getattr(original, name)

  def _draw(self, method: str, sample: Callable, shape, dtype, nonce, **kwargs):
    examples = self._passes.examples
    if examples is None:
      return getattr(self._original, method)(shape, dtype=dtype, nonce=nonce, **kwargs)
    key = self._layer_index * _CALLS + self._passes.next_call(self._layer_index)
    dtype = dtype or keras.backend.floatx()
    shape = tf.convert_to_tensor(shape, tf.int32)
    if shape.shape[0] == 0:
      return sample(shape, seed=tf.constant([key, -1], tf.int64), dtype=dtype, **kwargs)
    rows = shape[0]
    keys = tf.cond(tf.equal(rows, tf.size(examples)), lambda: examples,
                   lambda: -1 - tf.range(tf.cast(rows, tf.int64)))  # not the examples: by position
    seeds = tf.stack([tf.fill(tf.shape(keys), tf.constant(key, tf.int64)), keys], axis=1)
    return tf.map_fn(lambda seed: sample(shape[1:], seed=seed, dtype=dtype, **kwargs), seeds,
                     fn_output_signature=dtype)


class FixedPasses:
  """Which probe examples the current pass runs on, and how often each layer drew in it."""

  def __init__(self):
    self.examples: Optional[tf.Tensor] = None
    self._calls: dict[int, int] = {}

  def next_call(self, layer_index: int) -> int:
    call = self._calls.get(layer_index, 0)
    self._calls[layer_index] = call + 1
    return call

  @contextlib.contextmanager
  def over(self, examples: list) -> Iterator[None]:
    """One forward pass on the probe's examples ``examples``, in this order."""
    self.examples, self._calls = tf.constant(examples, tf.int64), {}
    try:
      yield
    finally:
      self.examples = None


@contextlib.contextmanager
def fixed_noise(model: keras.Model) -> Iterator[FixedPasses]:
  """Within the block, the random layers of ``model`` draw :class:`FixedNoise` in passes.

  The generator is swapped in the layer's ``__dict__``, bypassing Keras's
  attribute tracking, so that the model's checkpoint structure is unchanged.
  """
  passes = FixedPasses()
  everything = model._flatten_layers(include_self=True)
  layers = [layer for layer in everything if vars(layer).get(_RANDOM_GENERATOR) is not None]
  originals = [vars(layer)[_RANDOM_GENERATOR] for layer in layers]
  for index, (layer, original) in enumerate(zip(layers, originals)):
    vars(layer)[_RANDOM_GENERATOR] = FixedNoise(index, original, passes)
  try:
    yield passes
  finally:
    for layer, original in zip(layers, originals):
      vars(layer)[_RANDOM_GENERATOR] = original
