"""Membership of ids in a sorted id list, in O(n log m) without a hash table."""

from __future__ import annotations

import tensorflow as tf

from sparse_dp.mechanisms.rows import scans


def sorted_lookup(sorted_ids: tf.Tensor, ids: tf.Tensor,
                  ids_sorted: bool = False) -> tuple[tf.Tensor, tf.Tensor]:
  """Position of each of ``ids`` in ``sorted_ids``, and whether it is there.

  ``sorted_ids`` is a sorted, distinct int64 vector (possibly empty); ``ids``
  are non-negative int64 of any shape (``ids_sorted``: a sorted vector, which spares a sort
  under XLA). Returns ``(slot, found)`` of the shape of ``ids``: where ``found``,
  ``sorted_ids[slot] == ids``.
  """
  flat = tf.reshape(ids, [-1])
  slot = scans.searchsorted(sorted_ids, flat, side="left", sorted_queries=ids_sorted)
  # A -1 sentinel after the last id: a slot past the end never matches.
  padded = tf.concat([sorted_ids, tf.constant([-1], tf.int64)], axis=0)
  found = tf.equal(tf.gather(padded, slot), flat)
  shape = tf.shape(ids)
  return tf.reshape(slot, shape), tf.reshape(found, shape)
