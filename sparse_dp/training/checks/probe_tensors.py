"""Tensor helpers of the separability probe: taking examples out of a batch, comparing.

A batch is any nesting of dense, ragged and sparse tensors whose first
dimension is the examples.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from sparse_dp.layers.embedding import leading_dimension

# Relative tolerance of the probe's comparisons, against the largest value
# compared: float32 rounding is ~1e-7 per operation, while one example of 13
# moves a batch statistic by ~1/13.
TOLERANCE = 1e-4


def probe_weights(n: int) -> tf.Tensor:
  """Distinct random weights, fixed: what the probe reveals is pass or refuse only."""
  return tf.constant(np.random.default_rng(0).uniform(0.5, 1.5, n), tf.float32)


def not_per_example(weighted, plain, weights, example) -> bool:
  """Whether ``weighted`` differs from ``weights[example] * plain`` row by row."""
  if weighted is None and plain is None:
    return False
  if weighted is None or plain is None:
    return True
  weighted, plain = tf.convert_to_tensor(weighted), tf.convert_to_tensor(plain)
  count = tf.shape(plain)[0]
  scale = tf.gather(tf.cast(weights, plain.dtype),
                    tf.range(count) if example is None else tf.cast(example, tf.int32))
  expected = plain * tf.reshape(scale, [-1] + [1] * (plain.shape.rank - 1))
  return not close(weighted, expected)


def close(a, b) -> bool:
  """Equal up to :data:`TOLERANCE`, with non-finite entries where both are non-finite.

  A non-finite entry is an example the DP step drops (its loss or gradient is
  not finite, so it adds nothing): e.g. the mean of an empty history, 0/0.
  """
  a, b = tf.convert_to_tensor(a), tf.convert_to_tensor(b)
  if a.shape != b.shape:
    return False
  if tf.size(a) == 0:
    return True
  a, b = tf.cast(a, tf.float64), tf.cast(b, tf.float64)
  finite = tf.math.is_finite(a)
  if not bool(tf.reduce_all(tf.equal(finite, tf.math.is_finite(b)))):
    return False
  a, b = tf.where(finite, a, 0.0), tf.where(finite, b, 0.0)
  largest = tf.maximum(tf.reduce_max(tf.abs(a)), tf.reduce_max(tf.abs(b)))
  return bool(tf.reduce_max(tf.abs(a - b)) <= TOLERANCE * largest)


def per_example(structure, n: int, floating: bool) -> list:
  """The tensors of ``structure`` whose first dimension is the ``n`` examples."""
  return [t for t in tf.nest.flatten(structure, expand_composites=False)
          if is_batch(t, n) and (not floating or (isinstance(t, tf.Tensor)
                                                   and t.dtype.is_floating))]


def is_batch(value, n: int) -> bool:
  return (isinstance(value, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor))
          and value.shape.rank != 0 and rows(value) == n)


def rows(value) -> int:
  if isinstance(value, tf.RaggedTensor):
    return int(value.nrows())
  if isinstance(value, tf.SparseTensor):
    return int(value.dense_shape[0])
  return int(leading_dimension(value))


def batch_size(batch) -> int:
  first = tf.nest.flatten(batch, expand_composites=False)[0]
  return rows(first)


def as_tensor(value):
  if isinstance(value, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor)):
    return value
  return tf.convert_to_tensor(value)


def take(data, examples: list):
  """Examples ``examples`` of a batch (tensors, ragged or sparse tensors, in any nesting)."""
  indices = tf.constant(examples, tf.int64)

  def take_rows(value):
    if isinstance(value, tf.SparseTensor):
      return _take_sparse(value, indices)
    if isinstance(value, (tf.Tensor, tf.RaggedTensor)) and value.shape.rank != 0:
      return tf.gather(value, indices)
    return value
  return tf.nest.map_structure(take_rows, data, expand_composites=False)


def _take_sparse(value: tf.SparseTensor, indices: tf.Tensor) -> tf.SparseTensor:
  position = tf.scatter_nd(indices[:, None], tf.range(1, tf.size(indices, tf.int64) + 1),
                           value.dense_shape[:1]) - 1  # -1: a row not taken
  new_row = tf.gather(position, value.indices[:, 0])
  kept = new_row >= 0
  kept_indices = tf.concat([new_row[kept][:, None], tf.boolean_mask(value.indices, kept)[:, 1:]], 1)
  shape = tf.concat([tf.size(indices, tf.int64)[None], value.dense_shape[1:]], 0)
  return tf.sparse.reorder(tf.SparseTensor(kept_indices, tf.boolean_mask(value.values, kept),
                                           shape))


def flatten_with_paths(structure, path: str = "") -> list:
  """``(name, leaf)`` for the leaves of nested dicts, lists and tuples."""
  if isinstance(structure, dict):
    items = [(f"{path}/{key}" if path else str(key), value) for key, value in structure.items()]
  elif isinstance(structure, (list, tuple)):
    items = [(f"{path}/{i}" if path else str(i), value) for i, value in enumerate(structure)]
  else:
    return [(f"'{path}'", structure)]
  return [leaf for name, value in items for leaf in flatten_with_paths(value, name)]
