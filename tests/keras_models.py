"""Small synthetic models and data for the Keras training tests."""

import numpy as np
import tensorflow as tf

from sparse_dp.layers import Embedding

N, VOCAB = 4096, 1000


def synthetic_data(seed=0):
  """Zipf-distributed ids whose hidden per-id score sets the label."""
  rng = np.random.default_rng(seed)
  ids = (rng.zipf(1.3, N) % VOCAB).astype("int64")
  score = rng.normal(size=VOCAB) * 2
  labels = (score[ids] + 0.3 * rng.normal(size=N) > 0).astype("float32")
  return ids, labels


def functional_model(vocabulary=VOCAB, optimizer=None, seed=1):
  tf.keras.utils.set_random_seed(seed)
  ids = tf.keras.Input(shape=(), dtype=tf.int64)
  embedded = Embedding(vocabulary, 8, name="ids")(ids)
  hidden = tf.keras.layers.Dense(16, activation="relu")(embedded)
  model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(hidden))
  model.compile(optimizer=optimizer or tf.keras.optimizers.legacy.SGD(0.5),
                loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
  return model


class SubclassedModel(tf.keras.Model):
  """A tf.keras.Model subclass with its own call."""

  def __init__(self, vocabulary=VOCAB):
    super().__init__()
    self.table = Embedding(vocabulary, 8)
    self.hidden = tf.keras.layers.Dense(16, activation="relu")
    self.logit = tf.keras.layers.Dense(1)

  def call(self, ids):
    return self.logit(self.hidden(self.table(ids)))
