"""Poisson sampling of batches from in-memory data (core paper §3.3).

The accountant assumes every example joins every batch independently with
probability ``q``. ``poisson_batches`` does exactly that: the batch of step
``t`` holds the examples at the positions :func:`bernoulli_positions` draws
from ``[0, N)`` with seed ``fold_in(seed, t)``, so batch sizes vary around
``q N`` and the work per batch is O(batch), not O(N).
"""

from __future__ import annotations

import tensorflow as tf

from sparse_dp.mechanisms import bernoulli_positions


def poisson_batches(data, sampling_rate: float, steps: int, seed: int = 0) -> tf.data.Dataset:
  """``steps`` Poisson-sampled batches of ``data`` (a nest of tensors of N rows)."""
  if not 0 < sampling_rate <= 1:
    raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
  if steps < 1:
    raise ValueError(f"steps must be >= 1, got {steps}")
  data = tf.nest.map_structure(tf.convert_to_tensor, data)
  sizes = {int(t.shape[0]) for t in tf.nest.flatten(data)}
  if len(sizes) != 1:
    raise ValueError(f"every tensor of data needs the same number of rows, got {sorted(sizes)}")
  num_examples = sizes.pop()
  base = tf.constant([seed, 0x5DEECE66D], tf.int64)

  def batch(step):
    positions = bernoulli_positions(num_examples, sampling_rate,
                                    tf.random.experimental.stateless_fold_in(base, step))
    return tf.nest.map_structure(lambda t: tf.gather(t, positions), data)

  return tf.data.Dataset.range(steps).map(batch)
