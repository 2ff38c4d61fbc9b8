"""A subclassed ``tfrs.Model`` ranking model on the tiny data of :mod:`support.keras_models`."""

import tensorflow_recommenders as tfrs

from sparse_dp import keras
from sparse_dp.layers import Embedding

from support.keras_models import VOCAB


class RankingModel(tfrs.Model):
  """One table, two Dense layers and TFRS's ``Ranking`` task with the given loss reduction."""

  def __init__(self, reduction):
    super().__init__()
    self.table = Embedding(VOCAB, 8)
    self.score = keras.Sequential([keras.layers.Dense(16, activation="relu"),
                                      keras.layers.Dense(1)])
    self.task = tfrs.tasks.Ranking(
        loss=keras.losses.BinaryCrossentropy(from_logits=True, reduction=reduction),
        metrics=[keras.metrics.BinaryAccuracy(threshold=0.0)])

  def call(self, ids):
    return self.score(self.table(ids))

  def compute_loss(self, features, training=False):
    ids, labels = features
    return self.task(labels=labels[:, None], predictions=self(ids))
