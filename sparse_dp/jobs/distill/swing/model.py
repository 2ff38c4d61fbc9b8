"""The next-item softmax model Swing distillation is run on, and its training loop.

``history [B, L] -> (hashed ids) -> sparse_dp Embedding (one vector per position)
-> flatten -> Dense(hidden, relu) -> Dense(num_items)``: logits over every item,
a softmax at inference. The teacher looks up every item id; the student hashes
the ids of its input side into fewer rows (``keras.layers.Hashing``, FarmHash),
has a smaller embedding dimension and fewer hidden units, and keeps the full
softmax over items (it must still name the next item).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.jobs.distill.swing.temperature import SwingTargets, distillation_loss
from sparse_dp.layers import Embedding


@dataclasses.dataclass(frozen=True)
class NextItemModelSpec:
  """Sizes of a next-item model; ``hash_buckets=None`` looks up every item id."""

  num_items: int
  history_length: int
  embedding_dim: int
  hidden_units: int
  hash_buckets: Optional[int] = None

  def __post_init__(self):
    for name in ("num_items", "history_length", "embedding_dim", "hidden_units"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
    if self.hash_buckets is not None and not 1 <= self.hash_buckets:
      raise ValueError(f"hash_buckets must be >= 1, got {self.hash_buckets}")

  @property
  def input_rows(self) -> int:
    return self.num_items if self.hash_buckets is None else self.hash_buckets

  def trainable_parameters(self) -> int:
    """``R d + (L d) h + h + h V + V`` (table, hidden layer, output layer)."""
    table = self.input_rows * self.embedding_dim
    hidden = self.history_length * self.embedding_dim * self.hidden_units + self.hidden_units
    output = self.hidden_units * self.num_items + self.num_items
    return table + hidden + output

  def build(self, name: str, seed: int) -> keras.Model:
    def initializer(offset):
      return keras.initializers.GlorotUniform(seed=seed + offset)
    history = keras.Input(shape=(self.history_length,), dtype=tf.int64, name="history")
    ids = history
    if self.hash_buckets is not None:
      ids = keras.layers.Hashing(num_bins=self.hash_buckets, name="hashed_items")(history)
    vectors = Embedding(self.input_rows, self.embedding_dim, combiner=None, name="items",
                        embeddings_initializer=keras.initializers.RandomUniform(
                            -0.05, 0.05, seed=seed))(ids)
    hidden = keras.layers.Dense(self.hidden_units, activation="relu", name="hidden",
                                kernel_initializer=initializer(1))(
                                    keras.layers.Flatten()(vectors))
    logits = keras.layers.Dense(self.num_items, name="logits",
                                kernel_initializer=initializer(2))(hidden)
    return keras.Model(history, logits, name=name)


@dataclasses.dataclass(frozen=True)
class TrainSettings:
  epochs: int
  batch_size: int
  learning_rate: float
  seed: int


def fit(model: keras.Model, histories: np.ndarray, labels: np.ndarray,
        settings: TrainSettings, targets: Optional[np.ndarray] = None,
        temperature: float = 1.0, alpha: float = 0.0) -> None:
  """Adam on Eq. 11's loss (labels only when ``targets`` is None), shuffled each epoch."""
  optimizer = keras.optimizers.Adam(settings.learning_rate)
  columns = (histories, labels) if targets is None else (histories, labels, targets)
  dataset = (tf.data.Dataset.from_tensor_slices(columns)
             .shuffle(len(labels), seed=settings.seed, reshuffle_each_iteration=True)
             .batch(settings.batch_size))

  def step(batch_histories, batch_labels, batch_targets=None):
    with tf.GradientTape() as tape:
      logits = model(batch_histories, training=True)
      loss = distillation_loss(logits, batch_labels, batch_targets, temperature, alpha)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))

  # One trace for every batch, the last (smaller) one included.
  step = tf.function(step, input_signature=dataset.element_spec)

  for _ in range(settings.epochs):
    for batch in dataset:
      step(*batch)


def predict_logits(model: keras.Model, histories: np.ndarray, batch_size: int) -> np.ndarray:
  return model.predict(histories, batch_size=batch_size, verbose=0)


def predict_probabilities(model: keras.Model, histories: np.ndarray,
                          batch_size: int) -> np.ndarray:
  """``softmax(z)`` at temperature 1 (§3.4: inference uses T = 1)."""
  return tf.nn.softmax(predict_logits(model, histories, batch_size)).numpy()


def teacher_targets(teacher_logits: np.ndarray, histories: np.ndarray, swing: SwingTargets,
                    batch_size: int, seed: int) -> np.ndarray:
  """The teacher's answers to the student's inputs, each drawn once (float32 ``[N, V]``)."""
  batches = []
  for index, start in enumerate(range(0, len(histories), batch_size)):
    stop = start + batch_size
    batches.append(swing(tf.constant(teacher_logits[start:stop]),
                         tf.constant(histories[start:stop]),
                         tf.constant([seed, index], tf.int64)).numpy())
  return np.concatenate(batches).astype(np.float32)
