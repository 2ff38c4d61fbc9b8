"""State a model holds that may come from data is refused at make_private unless declared public.

A frozen ``BatchNormalization`` whose moving statistics were set by a pass over data
before ``make_private``, and a lookup table built from the ids that occur (held by a
layer, or referred to by a ``Lambda``), are released with the model without noise: they
are refused, named with the declaration ``public_layers=[...]`` that accepts them (the
same as for adapted preprocessing layers). A constant written in a layer's
configuration (``Rescaling``'s scale) is the user's declared configuration
(docs/epsilon.md, "The sample").
"""

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding

N, B, VOCAB = 100, 10, 16
CONFIG = sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0)
DATA = np.random.default_rng(0).normal(3.0, 2.0, size=(N, 2)).astype("float32")
IDS = np.random.default_rng(1).integers(100, 200, size=N)


def compiled(inputs, outputs, name):
  model = keras.Model(inputs, outputs, name=name)
  model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model


def frozen_batch_normalization(warmed: bool):
  bn = keras.layers.BatchNormalization(name="bn")
  values = keras.Input(shape=(2,))
  model = compiled(values, keras.layers.Dense(1)(bn(values)), "frozen_bn")
  if warmed:
    for _ in range(3):
      bn(DATA, training=True)  # moving statistics of the (private) data
  bn.trainable = False
  model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model


def vocabulary_table():
  """A hand-built table of the ids that occur in the data."""
  keys = tf.constant(np.unique(IDS), tf.int64)
  return tf.lookup.StaticHashTable(
      tf.lookup.KeyValueTensorInitializer(keys, tf.range(1, tf.size(keys, tf.int64) + 1)), 0)


class Vocabulary(keras.layers.Layer):
  def __init__(self, table, **kwargs):
    super().__init__(**kwargs)
    self.table = table

  def call(self, ids):
    return self.table.lookup(ids)


def table_model(lookup):
  ids = keras.Input(shape=(), dtype=tf.int64)
  rows = lookup(ids)
  return compiled(ids, keras.layers.Dense(1)(Embedding(len(np.unique(IDS)) + 1, 2)(rows)),
                  "table_model")


def held_by_a_layer():
  return table_model(Vocabulary(vocabulary_table(), name="vocab"))


TABLE = vocabulary_table()


def referred_to_by_a_lambda():
  return table_model(keras.layers.Lambda(lambda ids: TABLE.lookup(ids), name="vocab"))


HELD = [
    (lambda: frozen_batch_normalization(warmed=True), "bn",
     "BatchNormalization.*moving_mean, moving_variance away from their initial values"),
    (held_by_a_layer, "vocab", "Vocabulary.*lookup table \\(StaticHashTable\\)"),
    (referred_to_by_a_lambda, "vocab", "Lambda.*lookup table \\(StaticHashTable\\)"),
]


@pytest.mark.parametrize("make, name, held", HELD)
def test_state_from_data_is_refused_naming_the_layer_and_the_declaration(make, name, held):
  with pytest.raises(ValueError, match=f"'{name}' \\({held}.*public_layers=\\['{name}'\\]"):
    sparse_dp.make_private(make(), CONFIG, num_examples=N, batch_size=B)


@pytest.mark.parametrize("make, name, held", HELD)
def test_state_declared_public_is_accepted(make, name, held):
  del held
  private = sparse_dp.make_private(make(), CONFIG, num_examples=N, batch_size=B,
                                   public_layers=[name])
  assert private.is_private


def test_a_frozen_batch_normalization_at_its_initial_statistics_is_accepted():
  model = frozen_batch_normalization(warmed=False)
  assert sparse_dp.make_private(model, CONFIG, num_examples=N, batch_size=B).is_private


def test_a_rescaling_constant_is_configuration_the_user_declares_by_writing_it():
  # The scale is computed from the data here; a constant in a layer's config cannot be told
  # apart from one the user chose, so it is public configuration (docs/epsilon.md).
  values = keras.Input(shape=(2,))
  scaled = keras.layers.Rescaling(1.0 / float(DATA.max()), name="scale")(values)
  model = compiled(values, keras.layers.Dense(1)(scaled), "rescaled")
  assert sparse_dp.make_private(model, CONFIG, num_examples=N, batch_size=B).is_private
