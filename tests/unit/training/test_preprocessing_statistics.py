"""Preprocessing layers with statistics of the private data are refused unless declared public."""

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding

N, B = 100, 10
CONFIG = sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0)


def numeric_model(preprocess, name):
  values = keras.Input(shape=(1,), dtype=tf.float32)
  model = keras.Model(values, keras.layers.Dense(1)(preprocess(values)), name=name)
  model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model


def adapted(layer, data):
  layer.adapt(data)
  return layer


def lookup_model(lookup):
  words = keras.Input(shape=(), dtype=tf.string)
  ids = lookup(words)
  model = keras.Model(words, keras.layers.Dense(1)(Embedding(lookup.vocabulary_size(), 2)(ids)))
  model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model


DATA = np.random.default_rng(0).normal(size=(N, 1)).astype("float32")
LAYERS = [
    (lambda: numeric_model(adapted(keras.layers.Normalization(name="norm"), DATA), "m1"),
     "norm", "mean and variance"),
    (lambda: numeric_model(keras.layers.Normalization(mean=0.5, variance=2.0, name="given"),
                           "m2"), "given", "mean and variance"),
    (lambda: numeric_model(adapted(keras.layers.Discretization(num_bins=4, name="bins"), DATA),
                           "m3"), "bins", "quantiles"),
    (lambda: lookup_model(keras.layers.StringLookup(vocabulary=["a", "b", "c"], name="vocab")),
     "vocab", "vocabulary"),
]


@pytest.mark.parametrize("make, name, held", LAYERS)
def test_a_layer_holding_data_statistics_is_refused_naming_it_and_the_declaration(make, name,
                                                                                   held):
  with pytest.raises(ValueError, match=f"'{name}'.*{held}.*public_layers=\\['{name}'\\]"):
    sparse_dp.make_private(make(), CONFIG, num_examples=N, batch_size=B)


@pytest.mark.parametrize("make, name, held", LAYERS)
def test_a_layer_declared_public_is_accepted(make, name, held):
  del held
  private = sparse_dp.make_private(make(), CONFIG, num_examples=N, batch_size=B,
                                   public_layers=[name])
  assert private.is_private


def test_hashing_holds_no_statistics_and_unknown_names_are_refused():
  ids = keras.Input(shape=(), dtype=tf.int64)
  model = keras.Model(ids, keras.layers.Dense(1)(
      Embedding(16, 2)(keras.layers.Hashing(16)(ids))))
  model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  with pytest.raises(ValueError, match="public_layers names \\['nope'\\]"):
    sparse_dp.make_private(model, CONFIG, num_examples=N, batch_size=B, public_layers=["nope"])
  assert sparse_dp.make_private(model, CONFIG, num_examples=N, batch_size=B).is_private


def test_a_layer_can_be_declared_public_by_itself_and_a_bare_name_or_object_is_refused():
  model = lookup_model(keras.layers.StringLookup(vocabulary=["a", "b", "c"], name="vocab"))
  with pytest.raises(TypeError, match="a list of layers or names, got 'vocab'"):
    sparse_dp.make_private(model, CONFIG, num_examples=N, batch_size=B, public_layers="vocab")
  with pytest.raises(TypeError, match="layers or their names, got 3"):
    sparse_dp.make_private(model, CONFIG, num_examples=N, batch_size=B, public_layers=[3])
  assert sparse_dp.make_private(model, CONFIG, num_examples=N, batch_size=B,
                                public_layers=[model.get_layer("vocab")]).is_private


def test_a_public_layer_must_be_the_model_s_own_and_its_name_must_be_its_alone():
  def nested(name):
    ids = keras.Input(shape=(), dtype=tf.string)
    return keras.Model(ids, keras.layers.StringLookup(vocabulary=["a", "b"], name="vocab")(ids),
                       name=name)
  ids = keras.Input(shape=(), dtype=tf.string)
  first, second = nested("first"), nested("second")
  tables = [Embedding(3, 2)(first(ids)), Embedding(3, 2)(second(ids))]
  model = keras.Model(ids, keras.layers.Dense(1)(keras.layers.Concatenate()(tables)))
  model.compile(optimizer="sgd", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  with pytest.raises(ValueError, match="'vocab', the name of more than one layer"):
    sparse_dp.make_private(model, CONFIG, num_examples=N, batch_size=B,
                           public_layers=[first.get_layer("vocab")])
  stranger = keras.layers.StringLookup(vocabulary=["a"], name="vocab")
  with pytest.raises(ValueError, match="holds layer 'vocab', which model .* does not"):
    sparse_dp.make_private(lookup_model(keras.layers.StringLookup(vocabulary=["a"],
                                                                  name="vocab")),
                           CONFIG, num_examples=N, batch_size=B, public_layers=[stranger])
