"""The tiny embedding model the strategy scripts (mirrored, multi-worker) train."""

import tensorflow as tf

from sparse_dp import keras
from sparse_dp.layers import Embedding


def tiny_model(vocabulary_size: int) -> keras.Model:
  """Embedding(V, 4) -> Dense(8, relu) -> Dense(1), seeded weights, SGD(0.5), compiled.

  Call it inside the strategy's scope.
  """
  keras.utils.set_random_seed(5)
  inputs = keras.Input(shape=(), dtype=tf.int64)
  hidden = keras.layers.Dense(8, activation="relu")(Embedding(vocabulary_size, 4)(inputs))
  model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.5),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model
