"""DP-SGD's Gaussian noise on every row of a table, drawn in row chunks on a large table.

DP-SGD (Abadi et al., CCS 2016; the dense reference of Ghazi et al., NeurIPS 2023,
Algorithm 1 with every row selected) releases a table's update
``G = sum_i [g_i]_C2 + sigma C2 Z`` with ``Z ~ N(0, I)`` of the table's shape ``[V, d]``.
A table of at most :data:`CHUNK_ROWS` rows draws ``Z = standard_normal([V, d], seed)`` in one
piece. A larger one draws rows ``[k m, (k + 1) m)`` (``m = CHUNK_ROWS``) as
``standard_normal([m_k, d], s_k)`` with ``(s_0, ..., s_{K-1}) = split(seed, K)``: independent
streams, so ``Z`` is still i.i.d. ``N(0, 1)`` and the accounting is DP-SGD's. ``G`` is made in
one buffer, each chunk's noise plus the clipped rows that fall in it written in place, each
chunk's draw waiting for the previous chunk, so one chunk's temporaries live at a time; it is
returned as ``tf.IndexedSlices`` over every row, which legacy SGD applies as one scatter
without copying the table. See docs/dpsgd_large_tables.md.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence, Union

import tensorflow as tf

from sparse_dp.mechanisms.randomness.gaussian import standard_normal
from sparse_dp.mechanisms.randomness.seeds import split
from sparse_dp.mechanisms.rows.padding import mask_rows

# Tables of more rows draw their noise in chunks of this many rows (at dimension 107, the
# largest of the pCTR model at 100x Table 3, a chunk is 112 MiB and its draw ~0.45 GiB).
CHUNK_ROWS = 2**18


@dataclasses.dataclass(frozen=True)
class NoisyTable:
  """A table's clipped sum plus dense noise, and the noise's squared norm.

  Attributes:
    sum: the noisy sum ``[V, d]``: a dense tensor, or ``tf.IndexedSlices`` over every row for a
      table of more than :data:`CHUNK_ROWS` rows.
    noise_squared: ``||stddev Z||^2``, a debug statistic that is not private.
  """

  sum: Union[tf.Tensor, tf.IndexedSlices]  # [V, d]: dense, or IndexedSlices over every row
  noise_squared: tf.Tensor  # ||stddev Z||^2 (a debug statistic, not private)


def add_dense_noise(clipped: tf.IndexedSlices, shape: Sequence[int], stddev, seed: tf.Tensor,
                    after: Sequence = ()) -> NoisyTable:
  """DP-SGD's noisy update of one table: its clipped sum plus noise on every coordinate.

  The update is ``G = sum_i [g_i]_C2 + sigma C2 Z`` with ``Z ~ N(0, I)`` of the table's shape
  (Algorithm 1 with every row selected).
  A table of more than :data:`CHUNK_ROWS` rows draws ``Z`` in chunks of rows, each from its own
  seed of ``split(seed, K)``.
  The chunks' streams are independent, so ``Z`` is still i.i.d. ``N(0, 1)``.
  See docs/dpsgd_large_tables.md for the layout.

  Args:
    clipped: the table's clipped sum; its indices may repeat (they are summed).
    shape: the table's static shape ``[V, d]``.
    stddev (float | tf.Tensor): the noise's standard deviation, ``sigma C2``.
    seed: shape ``[2]`` integer seed.
    after: tensors or ops that the noise is drawn after.

  Returns:
    The noisy sum and the noise's squared norm.
      The sum is dense ``[V, d]`` for a table of at most :data:`CHUNK_ROWS` rows, and
      ``tf.IndexedSlices`` over every row for a larger one.
  """
  rows, width = (int(n) for n in shape)
  if rows <= CHUNK_ROWS:
    with tf.control_dependencies(after):
      draw = standard_normal(clipped.dense_shape, seed) * stddev
    noisy = tf.tensor_scatter_nd_add(draw, clipped.indices[:, None], clipped.values)
    return NoisyTable(noisy, tf.reduce_sum(tf.square(draw)))
  with tf.control_dependencies(after):
    # Not tf.zeros: measured, a zeros buffer of this shape stayed resident after the step
    # and the first in-place write copied it (a Grappler constant, it seems).
    noisy = tf.raw_ops.Empty(shape=[rows, width], dtype=clipped.values.dtype, init=True)
  indices = tf.cast(clipped.indices, tf.int64)
  squares = []
  for index, chunk_seed in enumerate(split(seed, -(-rows // CHUNK_ROWS))):
    start = index * CHUNK_ROWS
    stop = min(start + CHUNK_ROWS, rows)
    with tf.control_dependencies([noisy]):  # the previous chunk is in place: its draw is freed
      draw = standard_normal([stop - start, width], chunk_seed) * stddev
    squares.append(tf.reduce_sum(tf.square(draw)))
    chunk = _plus_rows_within(draw, indices - start, clipped.values)
    # An update of the buffer's rows in place (TensorFlow forwards a tensor with one reader;
    # tensor_scatter_nd_add would copy the whole buffer).
    noisy = tf.raw_ops.TensorStridedSliceUpdate(input=noisy, begin=[start, 0], end=[stop, width],
                                                strides=[1, 1], value=chunk)
  return NoisyTable(tf.IndexedSlices(noisy, tf.range(rows, dtype=tf.int64),
                                     tf.constant([rows, width], tf.int64)), tf.add_n(squares))


def _plus_rows_within(chunk: tf.Tensor, rows: tf.Tensor, values: tf.Tensor) -> tf.Tensor:
  """``chunk [m, d]`` plus ``values[i]`` at row ``rows[i]`` of it, for the ``rows`` in
  ``[0, m)`` (repeats summed); the others add nothing."""
  within = tf.logical_and(rows >= 0, rows < tf.shape(chunk, out_type=tf.int64)[0])
  return tf.tensor_scatter_nd_add(chunk, tf.where(within, rows, tf.zeros_like(rows))[:, None],
                                  mask_rows(values, within))
