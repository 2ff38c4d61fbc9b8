"""sparse_dp.layers.Embedding: id layouts, shared tables, bad ids, config, SavedModel."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp import keras
from sparse_dp.layers import Embedding


def table(layer):
  return layer.embeddings.numpy()


def test_layouts_and_combiners():
  layer = Embedding(10, 3, combiner="sum")
  ragged = tf.ragged.constant([[1, 1, 4], [], [9]], tf.int64)
  out = layer(ragged).numpy()  # builds lazily on first call
  w = table(layer)
  np.testing.assert_allclose(out, [2 * w[1] + w[4], np.zeros(3), w[9]], rtol=1e-6)
  np.testing.assert_allclose(layer(ragged.to_sparse()).numpy(), out, rtol=1e-6)
  mean = Embedding(10, 3, combiner="mean")
  got = mean(tf.constant([[1, 2], [3, 3]], tf.int64)).numpy()
  w = table(mean)
  np.testing.assert_allclose(got, [(w[1] + w[2]) / 2, w[3]], rtol=1e-6)
  tokens = Embedding(10, 3, combiner=None)
  assert tokens(tf.constant([[1, 2, 3]], tf.int64)).shape == (1, 3, 3)
  assert Embedding(10, 3)(tf.constant([5])).shape == (1, 3)
  with pytest.raises(ValueError, match="need a combiner"):
    tokens(ragged)


def test_shared_table_across_features():
  shared = Embedding(20, 2, name="shared")
  a, b = keras.Input(shape=(), dtype=tf.int64), keras.Input(shape=(), dtype=tf.int64)
  model = keras.Model([a, b], keras.layers.Add()([shared(a), shared(b)]))
  assert len(model.trainable_weights) == 1
  w = table(shared)
  np.testing.assert_allclose(model([tf.constant([3]), tf.constant([4])]).numpy(), [w[3] + w[4]])


def test_under_xla_ids_outside_the_vocabulary_read_nan_at_both_ends():
  # XLA compiles the assert away: an id < 0 or >= the vocabulary reads NaN (the DP step
  # then zeroes its example), whatever its size; the ids inside read their rows.
  layer = Embedding(10, 2, name="user_id")
  ids = tf.constant([-1, 0, 9, 10, -2**63, 2**63 - 1], tf.int64)
  vectors = tf.function(lambda ids: layer(ids), jit_compile=True)(ids).numpy()
  assert np.isnan(vectors[[0, 3, 4, 5]]).all()
  np.testing.assert_array_equal(vectors[1:3], table(layer)[[0, 9]])


@pytest.mark.parametrize("bad", [-987654, 987654, 10**12 + 987654])
def test_out_of_range_ids_fail_naming_layer_and_vocabulary_never_the_id(bad):
  # The id is the private data: the error names the layer, the vocabulary and the fix only.
  layer = Embedding(10, 2, name="user_id")
  with pytest.raises(tf.errors.InvalidArgumentError) as eager:
    layer(tf.constant([1, bad, 2], tf.int64))
  graph = tf.function(lambda ids: layer(ids))
  with pytest.raises(tf.errors.InvalidArgumentError) as traced:
    graph(tf.constant([bad, bad, 3], tf.int64))
  for error in (eager, traced):
    message = str(error.value)
    assert "Embedding layer user_id:" in message and "[0, 10)" in message
    assert "hash or bucket them" in message
    assert "987654" not in message and " 2 ids" not in message  # nor how many


def test_config_round_trip_and_bad_arguments():
  layer = Embedding(1000, 16, combiner="mean", name="item", table_placement="host")
  clone = Embedding.from_config(layer.get_config())
  assert (clone.vocabulary_size, clone.output_dim, clone.combiner, clone.name,
          clone.table_placement) == (1000, 16, "mean", "item", "host")
  assert json.dumps(layer.get_config())
  with pytest.raises(ValueError, match="vocabulary_size"):
    Embedding(0, 4)
  with pytest.raises(ValueError, match="combiner"):
    Embedding(4, 4, combiner="max")
  with pytest.raises(ValueError, match="layer 'item': table_placement must be one of "
                                       "default_device, host, got 'tpu'"):
    Embedding(4, 4, name="item", table_placement="tpu")


@pytest.mark.slow
def test_saved_model_serves_without_sparse_dp(tmp_path):
  ids = keras.Input(shape=(None,), dtype=tf.int64, ragged=True)
  model = keras.Model(ids, keras.layers.Dense(1)(Embedding(50, 4, name="tokens")(ids)))
  sample = tf.ragged.constant([[1, 2], [7]], tf.int64)
  expected = model(sample).numpy()
  model.save(str(tmp_path / "model"))  # SavedModel format

  # Keras reload with the layer registered.
  reloaded = keras.models.load_model(str(tmp_path / "model"))
  np.testing.assert_allclose(reloaded(sample).numpy(), expected, rtol=1e-6)
  # Plain TensorFlow serving, with sparse_dp made unimportable.
  script = textwrap.dedent(f"""
      import sys
      sys.modules["sparse_dp"] = None
      import tensorflow as tf
      served = tf.saved_model.load({str(tmp_path / "model")!r})
      out = served(tf.ragged.constant([[1, 2], [7]], tf.int64))
      print(out.numpy().ravel().tolist())
  """)
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
  np.testing.assert_allclose(json.loads(result.stdout.strip().splitlines()[-1]), expected.ravel(),
                             rtol=1e-6)
