"""Remap ids after a top-k preselection: kept buckets to dense ids, the rest to OOV.

After DP-FEST keeps ``k`` buckets of a feature, the table needs only ``k + 1``
rows: kept bucket ``kept[i]`` becomes id ``i``, and every other bucket shares
the out-of-vocabulary row ``k``. That row is trained like the others (it is a
public function of the selection), so buckets outside the top-k get one shared
embedding instead of none.
"""

from __future__ import annotations

import tensorflow as tf

from sparse_dp.mechanisms.rows.activations import Ids
from sparse_dp.mechanisms.rows.sorted_ids import sorted_lookup


class BucketRemapping(tf.Module):
  """Maps bucket ids to ``[0, k]`` after a top-k preselection.

  Kept bucket ``kept_buckets[i]`` (in sorted order) becomes id ``i``.
  Every other bucket becomes the shared out-of-vocabulary id ``k``.
  The mapping is plain TF ops, so it is serialisable with the model.
  Calling it maps dense, ``tf.RaggedTensor`` or ``tf.SparseTensor`` ids, keeping their dtype.

  Args:
    kept_buckets (array-like of int): the ``k`` kept bucket ids, distinct, in any order.
    name: the ``tf.Module``'s name.

  Attributes:
    kept_buckets: int64 ``[k]``, the kept bucket ids, sorted.

  Raises:
    ValueError: ``kept_buckets`` is empty, not a vector, or has repeated ids.
  """

  def __init__(self, kept_buckets, name: str | None = None):
    super().__init__(name=name)
    kept = tf.sort(tf.cast(tf.convert_to_tensor(kept_buckets), tf.int64))
    if kept.shape.rank != 1 or kept.shape[0] == 0:
      raise ValueError("kept_buckets must be a non-empty list of bucket ids")
    if bool(tf.reduce_any(kept[1:] == kept[:-1])):
      raise ValueError("kept_buckets has repeated ids")
    self.kept_buckets = tf.constant(kept)

  @property
  def vocabulary_size(self) -> int:
    """Rows the remapped table needs: ``k`` kept buckets plus one OOV row."""
    return int(self.kept_buckets.shape[0]) + 1

  @property
  def oov_id(self) -> int:
    """The id of every bucket outside the kept ones: ``k``, the table's last row."""
    return self.vocabulary_size - 1

  def __call__(self, ids: Ids) -> Ids:
    if isinstance(ids, tf.RaggedTensor):
      return ids.with_flat_values(self._remap(ids.flat_values))
    if isinstance(ids, tf.SparseTensor):
      return ids.with_values(self._remap(ids.values))
    return self._remap(ids)

  def _remap(self, ids: tf.Tensor) -> tf.Tensor:
    ids = tf.convert_to_tensor(ids)
    slot, found = sorted_lookup(self.kept_buckets, tf.cast(ids, tf.int64))
    oov = tf.size(self.kept_buckets, out_type=tf.int64)
    return tf.cast(tf.where(found, slot, oov), ids.dtype)
