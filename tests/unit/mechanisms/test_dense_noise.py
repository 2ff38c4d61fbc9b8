"""DP-SGD's dense noise on a large table: drawn in row chunks, still i.i.d. N(0, sigma^2 C^2),
and handed to the optimizer over every row as the update the dense gradient gives."""

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from sparse_dp import keras, mechanisms
from sparse_dp.layers import Embedding
from sparse_dp.mechanisms.noise import dense_noise
from sparse_dp.optimizers import LazyAdam, RowwiseAdagrad, create_weights
from sparse_dp.training.dp_step import dense_layers
from sparse_dp.training.dp_step.step import StepNoise, private_gradients

from support.stacks import ALPHA
from support.tiers import first_case_fast

ROWS, WIDTH, CHUNK = 2_000, 50, 128  # 16 chunks, the last of 80 rows


def _empty(rows, width):
  return tf.IndexedSlices(tf.zeros([0, width]), tf.zeros([0], tf.int64),
                          tf.constant([rows, width], tf.int64))


def test_a_table_at_the_chunk_size_keeps_the_single_draw_of_its_seed(monkeypatch, seed):
  monkeypatch.setattr(dense_noise, "CHUNK_ROWS", ROWS)
  clipped = tf.IndexedSlices(tf.ones([2, WIDTH]), tf.constant([4, 9], tf.int64),
                             tf.constant([ROWS, WIDTH], tf.int64))
  noisy = mechanisms.add_dense_noise(clipped, (ROWS, WIDTH), 0.5, seed)
  draw = mechanisms.standard_normal([ROWS, WIDTH], seed).numpy() * 0.5
  draw[[4, 9]] += 1.0
  np.testing.assert_array_equal(noisy.sum.numpy(), draw)


def test_a_large_table_draws_each_chunk_from_its_own_split_seed(monkeypatch, seed):
  monkeypatch.setattr(dense_noise, "CHUNK_ROWS", CHUNK)
  clipped = tf.IndexedSlices(tf.ones([3, WIDTH]), tf.constant([4, 4, 1999], tf.int64),
                             tf.constant([ROWS, WIDTH], tf.int64))
  noisy = mechanisms.add_dense_noise(clipped, (ROWS, WIDTH), 0.5, seed).sum
  assert isinstance(noisy, tf.IndexedSlices)
  np.testing.assert_array_equal(noisy.indices.numpy(), np.arange(ROWS))
  chunks = [mechanisms.standard_normal([min(CHUNK, ROWS - start), WIDTH], chunk_seed) * 0.5
            for start, chunk_seed in zip(range(0, ROWS, CHUNK), mechanisms.split(seed, 16))]
  want = np.concatenate([c.numpy() for c in chunks])
  want[4] += 2.0
  want[1999] += 1.0
  np.testing.assert_allclose(noisy.values.numpy(), want, rtol=1e-6, atol=1e-6)


def test_a_chunked_draw_is_iid_normal_across_chunk_boundaries(monkeypatch, seed):
  monkeypatch.setattr(dense_noise, "CHUNK_ROWS", CHUNK)
  std = 1.5
  noise = mechanisms.add_dense_noise(_empty(ROWS, WIDTH), (ROWS, WIDTH), std, seed)
  z = noise.sum.values.numpy() / std
  n = z.size
  assert float(noise.noise_squared) == pytest.approx(np.sum((z * std) ** 2), rel=1e-5)
  # mean 0, variance 1 (z-tests at ALPHA), the normal law (KS)
  bound = stats.norm.isf(ALPHA / 2)
  assert abs(z.mean()) * np.sqrt(n) < bound
  assert abs(z.var() - 1.0) / np.sqrt(2.0 / n) < bound
  assert stats.kstest(z.ravel(), "norm").pvalue > ALPHA
  # independence across each boundary: the last row of a chunk against the next one's first,
  # and every chunk against the first (a seed reused would repeat it: correlation 1)
  last, first = z[CHUNK - 1:ROWS - 1:CHUNK], z[CHUNK::CHUNK]
  assert stats.pearsonr(last.ravel(), first.ravel()).pvalue > ALPHA
  for start in range(CHUNK, ROWS - CHUNK, CHUNK):
    assert stats.pearsonr(z[:CHUNK].ravel(), z[start:start + CHUNK].ravel()).pvalue > ALPHA
  # and within the rows of one chunk, row r against row r + 1
  assert stats.pearsonr(z[:-1].ravel(), z[1:].ravel()).pvalue > ALPHA


def _model():
  keras.utils.set_random_seed(2)
  ids = keras.Input(shape=(2,), dtype=tf.int64)
  table = Embedding(ROWS // 10, 3, name="table")
  vectors = keras.layers.Flatten()(table(ids))
  return keras.Model(ids, keras.layers.Dense(1)(vectors))


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.legacy.SGD(0.3),
    "sgd-momentum": lambda: keras.optimizers.legacy.SGD(0.3, momentum=0.9),
    "adagrad": lambda: keras.optimizers.legacy.Adagrad(0.3),
    "rowwise-adagrad": lambda: RowwiseAdagrad(0.3),
    "lazy-adam": lambda: LazyAdam(0.03, weight_decay=0.1),
}
FAST_FIRST = ["sgd", "lazy-adam", "sgd-momentum", "adagrad", "rowwise-adagrad"]


# SGD, and LazyAdam (what a DP run's Adam becomes), in the fast tier.
@pytest.mark.parametrize("name", first_case_fast(FAST_FIRST, FAST_FIRST, fast=2))
def test_a_large_table_takes_the_update_of_its_dense_noisy_gradient(monkeypatch, name):
  """DP-SGD steps on a table of 200 rows in chunks of 16: the optimizer given the update over
  every row (IndexedSlices) ends at the weights it reaches given the same update dense."""
  monkeypatch.setattr(dense_noise, "CHUNK_ROWS", 16)
  rng = np.random.default_rng(0)
  x = tf.constant(rng.integers(0, ROWS // 10, (32, 2)), tf.int64)
  y = tf.constant(rng.integers(0, 2, (32, 1)), tf.float32)
  noise = StepNoise(gradient_multiplier=0.8, contribution_multiplier=None, l2_norm_clip=1.0,
                    contribution_clip=1.0, threshold=1.0, expected_batch_size=32.0)
  # Two like models: the first's private gradients, applied as they are to it and dense to the
  # second (one trace: the optimizers' weights made first, as fit makes them).
  models = _model(), _model()
  optimizers = [OPTIMIZERS[name]() for _ in models]
  for model, optimizer in zip(models, optimizers):
    create_weights(optimizer, model.trainable_variables)
  leaves = dense_layers.trainable_leaf_layers(models[0])

  def losses_of(data):
    logits = models[0](data[0], training=True)
    return tf.squeeze(tf.nn.sigmoid_cross_entropy_with_logits(data[1], logits), -1), None, None

  @tf.function
  def step(seed):
    gradients, _, _ = private_gradients(leaves, losses_of, (x, y), noise, seed)
    table = gradients[models[0].get_layer("table").embeddings.ref()]
    assert isinstance(table, tf.IndexedSlices) and table.indices.shape == [ROWS // 10]
    updates = [gradients[v.ref()] for v in models[0].trainable_variables]
    for dense, model, optimizer in zip((False, True), models, optimizers):
      optimizer.apply_gradients([(tf.convert_to_tensor(update) if dense else update, v)
                                 for update, v in zip(updates, model.trainable_variables)])

  for i in range(3):
    step(tf.constant([7, i], tf.int64))
  weights = [[w.numpy() for w in model.trainable_variables] for model in models]
  for sparse, dense in zip(*weights):
    np.testing.assert_allclose(sparse, dense, rtol=1e-5, atol=1e-6)
  assert np.all(weights[0][0] != _model().get_layer("table").embeddings.numpy())  # every row moved
