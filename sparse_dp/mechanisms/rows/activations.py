"""Which (example, row) pairs a batch of categorical ids activates.

Ids of one feature come as a dense ``[B]`` or ``[B, L]`` int tensor, a
``tf.RaggedTensor`` ``[B, None]``, or a ``tf.SparseTensor`` ``[B, L]``. Each is
reduced to the distinct pairs ``(example, row)``: an id repeated within one
example activates its row once (the contribution map counts examples: Ghazi et al.,
NeurIPS 2023, Algorithm 1, line 6). The pairs are kept
in a buffer as long as the lookups, padded (:mod:`sparse_dp.mechanisms.rows.padding`:
row ``PAD``, example 0), so the shapes do not depend on the data.
"""

from __future__ import annotations

from typing import NamedTuple, Union

import tensorflow as tf

from sparse_dp.mechanisms.rows import padding

Ids = Union[tf.Tensor, tf.RaggedTensor, tf.SparseTensor]


class Activations(NamedTuple):
  """The distinct activated pairs of one table: ``example[i]`` activates ``row[i]``.

  Attributes:
    example: int64 ``[n]`` in ``[0, batch_size)``; 0 where ``row`` is ``PAD``.
    row: int64 ``[n]``, sorted by ``(row, example)``, then ``PAD``.
    batch_size: int64 scalar, the examples of the batch.
  """

  example: tf.Tensor  # int64 [n], in [0, batch_size); 0 where row is PAD
  row: tf.Tensor  # int64 [n]: sorted by (row, example), then PAD
  batch_size: tf.Tensor  # int64 scalar


def activations(ids: Ids) -> Activations:
  """The distinct ``(example, row)`` pairs that one feature's ids activate.

  An id repeated within one example activates its row once.
  The contribution map counts examples (Algorithm 1, line 6).

  Args:
    ids: one feature's ids, each ``>= 0``: a dense ``[B]`` or ``[B, L]`` int tensor, a
      ``tf.RaggedTensor`` ``[B, None]`` or a ``tf.SparseTensor`` ``[B, L]``.

  Returns:
    The pairs, in a buffer as long as the lookups, then padding (row ``PAD``, example 0).

  Raises:
    ValueError: ragged ids of a ragged rank other than 1, or dense ids of a rank other than 1
      or 2.
    tf.errors.InvalidArgumentError: a negative id.
  """
  if isinstance(ids, tf.RaggedTensor):
    if ids.ragged_rank != 1:
      raise ValueError("ragged ids must have shape [batch, None], got ragged rank "
                       f"{ids.ragged_rank}")
    example, row, batch = ids.value_rowids(), ids.flat_values, ids.nrows()
  elif isinstance(ids, tf.SparseTensor):
    example, row, batch = ids.indices[:, 0], ids.values, ids.dense_shape[0]
  else:
    ids = tf.convert_to_tensor(ids)
    if ids.shape.rank not in (1, 2):
      raise ValueError(f"dense ids must have shape [batch] or [batch, L], got {ids.shape}")
    batch = tf.shape(ids, out_type=tf.int64)[0]
    if ids.shape.rank == 1:
      example, row = tf.range(batch), ids
    else:
      width = tf.shape(ids, out_type=tf.int64)[1]
      example = tf.repeat(tf.range(batch), width)
      row = tf.reshape(ids, [-1])
  example = tf.cast(example, tf.int64)
  row = tf.cast(row, tf.int64)
  batch = tf.cast(batch, tf.int64)
  # The message only, never the ids (private data).
  check = tf.debugging.Assert(tf.reduce_all(row >= 0), [
      "categorical ids must be >= 0 (not printed: ids are private data); map them into "
      "[0, vocabulary_size) first (hash or bucket them)"])
  with tf.control_dependencies([check]):
    row = tf.identity(row)
  example, row, _ = distinct_pairs(example, row, batch)
  return Activations(example, row, batch)


def distinct_pairs(example: tf.Tensor, row: tf.Tensor,
                   batch_size: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
  """The distinct ``(example, row)`` pairs, and for each input pair its distinct index.

  Pairs are keyed as ``row * batch_size + example`` (int64).
  The key is exact for rows below ``2**63 / batch_size``.
  The keys are made distinct by :func:`~sparse_dp.mechanisms.rows.padding.padded_unique`.
  Input pairs whose row is ``PAD`` are padding.

  Args:
    example: int64 ``[n]``, the example of each pair.
    row: int64 ``[n]``, the row of each pair, or ``PAD``.
    batch_size: int64 scalar, the examples of the batch.

  Returns:
    ``(example, row, index)``, each of the inputs' length ``n``.
      ``example`` and ``row`` hold the distinct pairs sorted by key, then padding (row ``PAD``,
      example 0).
      ``index[i]`` is the position of input pair ``i`` among them.
  """
  stride = tf.maximum(tf.cast(batch_size, tf.int64), 1)
  keys = tf.where(padding.is_valid(row), row * stride + example, padding.PAD)
  unique = padding.padded_unique(keys)
  valid = padding.is_valid(unique.values)
  return (tf.where(valid, unique.values % stride, tf.zeros_like(unique.values)),
          tf.where(valid, unique.values // stride, unique.values), unique.slot)
