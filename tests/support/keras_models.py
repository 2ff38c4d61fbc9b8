"""Small synthetic models and data for the Keras training tests."""

import numpy as np
import tensorflow as tf
import tensorflow_recommenders as tfrs

from sparse_dp import keras
from sparse_dp.layers import Embedding

N, VOCAB = 4096, 1000


def synthetic_data(seed=0):
  """Zipf-distributed ids whose hidden per-id score sets the label."""
  rng = np.random.default_rng(seed)
  ids = (rng.zipf(1.3, N) % VOCAB).astype("int64")
  score = rng.normal(size=VOCAB) * 2
  labels = (score[ids] + 0.3 * rng.normal(size=N) > 0).astype("float32")
  return ids, labels


def functional_model(vocabulary=VOCAB, optimizer=None, seed=1, table_placement="default_device"):
  keras.utils.set_random_seed(seed)
  ids = keras.Input(shape=(), dtype=tf.int64)
  embedded = Embedding(vocabulary, 8, name="ids", table_placement=table_placement)(ids)
  hidden = keras.layers.Dense(16, activation="relu")(embedded)
  model = keras.Model(ids, keras.layers.Dense(1)(hidden))
  model.compile(optimizer=optimizer or keras.optimizers.legacy.SGD(0.5),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model


class SubclassedModel(keras.Model):
  """A keras.Model subclass with its own call."""

  def __init__(self, vocabulary=VOCAB):
    super().__init__()
    self.table = Embedding(vocabulary, 8)
    self.hidden = keras.layers.Dense(16, activation="relu")
    self.logit = keras.layers.Dense(1)

  def call(self, ids):
    return self.logit(self.hidden(self.table(ids)))


class TwoTowers(tfrs.Model):
  """A query tower and a candidate tower: Embedding then Dense each."""

  def __init__(self, users=VOCAB, items=VOCAB, dim=8, item_combiner="sum"):
    super().__init__()
    self.query_tower = keras.Sequential([Embedding(users, dim, name="users"),
                                            keras.layers.Dense(dim, name="query")])
    self.item_tower = keras.Sequential([
        Embedding(items, dim, combiner=item_combiner, name="items"),
        keras.layers.Dense(dim, name="candidate")])


class PublicNegativesRetrieval(TwoTowers):
  """Retrieval that scores each query against its own positive and K public negatives.

  Every example looks up the same data-independent candidate ids itself (a
  ``[batch, 1 + K]`` lookup), so each example's loss depends on its own data
  only: separable, unlike ``tfrs.tasks.Retrieval``'s in-batch negatives.
  """

  def __init__(self, items=VOCAB, negatives=8):
    super().__init__(items=items, item_combiner=None)
    self.public_negatives = tf.range(negatives, dtype=tf.int64) * (items // negatives)
    self.softmax_loss = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction=keras.losses.Reduction.NONE)

  def compute_loss(self, features, training=False):
    users, items = features
    query = self.query_tower(users)
    negatives = tf.tile(self.public_negatives[None], [tf.shape(users, out_type=tf.int64)[0], 1])
    candidates = self.item_tower(tf.concat([items[:, None], negatives], axis=1))
    logits = tf.einsum("bd,bkd->bk", query, candidates)
    return self.softmax_loss(tf.zeros_like(users), logits)


class InBatchRetrieval(TwoTowers):
  """TFRS's two-tower retrieval with in-batch negatives (``tfrs.tasks.Retrieval``)."""

  def __init__(self):
    super().__init__()
    self.task = tfrs.tasks.Retrieval(
        loss=keras.losses.CategoricalCrossentropy(
            from_logits=True, reduction=keras.losses.Reduction.NONE), name="in_batch")

  def compute_loss(self, features, training=False):
    users, items = features
    return self.task(self.query_tower(users), self.item_tower(items), compute_metrics=False)


def small_vocabulary_batch(rows=8, vocabulary=40, ids_per_example=3):
  """A fixed batch of ``rows`` labelled examples of ``ids_per_example`` ids below ``vocabulary``."""
  rng = np.random.default_rng(0)
  return (tf.constant(rng.integers(0, vocabulary, (rows, ids_per_example)), tf.int64),
          tf.constant(rng.integers(0, 2, (rows, 1)), tf.float32))


def one_table_model(vocabulary: int, seed: int = 1, jit_compile: bool = False) -> keras.Model:
  """Embedding(vocabulary, 4) -> Dense(1), seeded, SGD(0.1), compiled (the custom-loop and
  provenance tests' model)."""
  keras.utils.set_random_seed(seed)
  ids = keras.Input(shape=(), dtype=tf.int64)
  model = keras.Model(ids, keras.layers.Dense(1)(Embedding(vocabulary, 4)(ids)))
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.1), jit_compile=jit_compile,
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model
