"""Table updates touch only the rows that receive a gradient."""

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding
from sparse_dp.optimizers import LazyAdam, sparse_optimizer

from support.keras_models import synthetic_data


@pytest.mark.parametrize("optimizer", [
    keras.optimizers.SGD(0.1, momentum=0.9), keras.optimizers.Adagrad(0.1),
    keras.optimizers.Adam(0.1), keras.optimizers.AdamW(0.1, weight_decay=0.01),
    keras.optimizers.legacy.Adam(0.1)])
def test_converted_optimizers_update_only_gradient_rows(optimizer):
  converted = sparse_optimizer(optimizer)
  table = tf.Variable(np.ones((100, 3), np.float32))
  untouched = np.ones(3, np.float32)
  for step in range(3):
    rows = tf.constant([2 + step, 50], tf.int64)
    converted.apply_gradients([(tf.IndexedSlices(tf.fill([2, 3], 0.5), rows, [100, 3]), table)])
    after = table.numpy()
    changed = np.flatnonzero(np.any(after != untouched, axis=1))
    assert set(changed) <= {2, 3, 4, 50} and 50 in changed
  np.testing.assert_array_equal(after[5:50], 1.0)


def test_lazy_adam_equals_adam_on_rows_updated_every_step():
  dense_var = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3))
  lazy_var = tf.Variable(dense_var.numpy())
  adam, lazy = keras.optimizers.legacy.Adam(0.05), LazyAdam(0.05)
  for step in range(4):
    g = np.full((4, 3), 0.1 * (step + 1), np.float32)
    adam.apply_gradients([(tf.constant(g), dense_var)])
    lazy.apply_gradients([(tf.IndexedSlices(tf.constant(g), tf.range(4, dtype=tf.int64), [4, 3]),
                           lazy_var)])
  np.testing.assert_allclose(lazy_var.numpy(), dense_var.numpy(), rtol=1e-6)


def test_unsupported_optimizer_is_refused():
  with pytest.raises(ValueError, match="not supported"):
    sparse_optimizer(keras.optimizers.RMSprop())


def test_adafest_step_on_a_50_million_row_table_touches_only_selected_rows():
  vocabulary = 50_000_000
  ids, labels = synthetic_data()
  keras.utils.set_random_seed(2)
  inputs = keras.Input(shape=(), dtype=tf.int64)
  layer = Embedding(vocabulary, 2, embeddings_initializer="zeros", name="big")
  model = keras.Model(inputs, keras.layers.Dense(1)(layer(inputs)))
  model.compile(optimizer=keras.optimizers.legacy.SGD(1.0),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  # tau with ~50 expected false positives among 5e7 zero rows at sigma1 * C1 = 1.
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig("adafest", noise_seed=1, sigma1=1.0, sigma2=1.0, threshold=5.9),
      num_examples=len(ids), batch_size=1024)
  history = model.fit(ids[:1024], labels[:1024], batch_size=1024, epochs=1, verbose=0)
  touched = np.flatnonzero(np.any(layer.embeddings.numpy() != 0, axis=1))
  nonzero_rows = history.history["nonzero_rows"][-1]
  assert 0 < len(touched) <= nonzero_rows < 1024 + 200
  assert history.history["gradient_size_reduction"][-1] > 40_000
  assert private.accountant.steps == 1
