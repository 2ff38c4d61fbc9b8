"""RowwiseAdagrad against an independent NumPy reference: rows, padding, XLA, slots, config."""

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding
from sparse_dp.layers.embedding_backends.tpu import engine_optimizer
from sparse_dp.optimizers import RowwiseAdagrad
from sparse_dp.training import UpdateOutsideDPStepError

ROWS, DIM, LR, INITIAL, EPS = 12, 3, 0.3, 0.1, 1e-7

# Per step: (indices, gradient rows) of the table; repeats are summed, rows of zeros are
# padding, rows 0, 4, 8-11 are absent from every step; then a dense gradient of the kernel.
rng = np.random.default_rng(0)
STEPS = [
    ([1, 3, 3, 7, 2], rng.normal(size=(5, DIM))),
    ([5, 2, 6, 6], np.vstack([rng.normal(size=(1, DIM)), np.zeros((1, DIM)),
                              rng.normal(size=(2, DIM))])),  # row 2: padding (all zero)
    ([7, 1, 1, 1], rng.normal(size=(4, DIM))),
]
KERNEL_GRADIENTS = [rng.normal(size=(DIM, 2)) for _ in STEPS]


class ReferenceRowwiseAdagrad:
  """FBGEMM's EXACT_ROWWISE_ADAGRAD on a table, element-wise Adagrad on dense weights."""

  def __init__(self, table, kernel):
    self.table, self.kernel = table.copy(), kernel.copy()
    self.table_accumulator = np.full(table.shape[0], INITIAL)
    self.kernel_accumulator = np.full(kernel.shape, INITIAL)

  def step(self, indices, rows, kernel_gradient):
    summed = {}
    for i, row in zip(indices, rows):
      summed[i] = summed.get(i, 0.0) + row
    for i, g in summed.items():
      self.table_accumulator[i] += np.mean(g ** 2)
      self.table[i] -= LR * g / (np.sqrt(self.table_accumulator[i]) + EPS)
    self.kernel_accumulator += kernel_gradient ** 2
    self.kernel -= LR * kernel_gradient / (np.sqrt(self.kernel_accumulator) + EPS)


def _table_and_kernel():
  layer = Embedding(ROWS, DIM)
  layer.build((None,))
  kernel = tf.Variable(np.ones((DIM, 2)), dtype=tf.float32)
  return layer.embeddings, kernel


@pytest.mark.parametrize("jit_compile", [False, True])
def test_matches_the_reference_on_repeated_absent_and_padding_rows(jit_compile):
  table, kernel = _table_and_kernel()
  reference = ReferenceRowwiseAdagrad(table.numpy(), kernel.numpy())
  optimizer = RowwiseAdagrad(LR, initial_accumulator_value=INITIAL, epsilon=EPS)

  @tf.function(jit_compile=jit_compile)
  def apply(indices, rows, kernel_gradient):
    optimizer.apply_gradients([
        (tf.IndexedSlices(rows, indices, tf.constant([ROWS, DIM], tf.int64)), table),
        (kernel_gradient, kernel)])

  for (indices, rows), kernel_gradient in zip(STEPS, KERNEL_GRADIENTS):
    apply(tf.constant(indices, tf.int64), tf.constant(rows, tf.float32),
          tf.constant(kernel_gradient, tf.float32))
    reference.step(indices, rows, kernel_gradient)
    np.testing.assert_allclose(table.numpy(), reference.table, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(optimizer.get_slot(table, "accumulator").numpy(),
                               reference.table_accumulator, rtol=1e-5)
    np.testing.assert_allclose(kernel.numpy(), reference.kernel, rtol=1e-5, atol=1e-6)
  untouched = [0, 4, 8, 9, 10, 11]
  assert np.all(optimizer.get_slot(table, "accumulator").numpy()[untouched] == INITIAL)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_dense_table_gradient_updates_every_row_by_the_row_rule(jit_compile):
  """DP-SGD's noisy table gradient is dense: the same rule on every row, slot still [rows]."""
  table, kernel = _table_and_kernel()
  reference = ReferenceRowwiseAdagrad(table.numpy(), kernel.numpy())
  optimizer = RowwiseAdagrad(LR, initial_accumulator_value=INITIAL, epsilon=EPS)
  gradient = rng.normal(size=(ROWS, DIM))

  @tf.function(jit_compile=jit_compile)
  def apply(table_gradient, kernel_gradient):
    optimizer.apply_gradients([(table_gradient, table), (kernel_gradient, kernel)])

  apply(tf.constant(gradient, tf.float32), tf.constant(KERNEL_GRADIENTS[0], tf.float32))
  reference.step(range(ROWS), gradient, KERNEL_GRADIENTS[0])
  np.testing.assert_allclose(table.numpy(), reference.table, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(optimizer.get_slot(table, "accumulator").numpy(),
                             reference.table_accumulator, rtol=1e-5)


def test_a_table_keeps_one_accumulator_per_row_and_dense_weights_one_per_coordinate():
  table, kernel = _table_and_kernel()
  optimizer = RowwiseAdagrad(LR)
  optimizer.apply_gradients([(tf.zeros([ROWS, DIM]), table), (tf.zeros([DIM, 2]), kernel)])
  assert optimizer.get_slot(table, "accumulator").shape == (ROWS,)
  assert optimizer.get_slot(kernel, "accumulator").shape == (DIM, 2)
  assert sum(int(np.prod(w.shape)) for w in optimizer.variables()) == 1 + ROWS + DIM * 2


def test_config_round_trip_and_keras_serialization():
  optimizer = RowwiseAdagrad(0.05, initial_accumulator_value=0.2, epsilon=1e-6)
  config = optimizer.get_config()
  again = RowwiseAdagrad.from_config(config)
  assert again.get_config() == config
  revived = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
  assert isinstance(revived, RowwiseAdagrad) and revived.get_config() == config
  for bad in (dict(initial_accumulator_value=-1.0), dict(epsilon=0.0)):
    with pytest.raises(ValueError, match=next(iter(bad))):
      RowwiseAdagrad(**bad)


def _private_model():
  inputs = keras.Input(shape=(), dtype=tf.int64)
  outputs = keras.layers.Dense(1)(Embedding(50, 4, name="ids")(inputs))
  model = keras.Model(inputs, outputs)
  model.compile(optimizer=RowwiseAdagrad(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model


def test_adafest_fit_moves_only_selected_rows_and_guards_the_optimizer():
  """(Under XLA: tests/integration/test_xla.py, compiled against graph steps.)"""
  model = _private_model()
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig("adafest", sigma1=0.5, sigma2=0.5, threshold=2.0, noise_seed=3),
      num_examples=1_000, batch_size=32)
  table = model.get_layer("ids").embeddings
  before = table.numpy()
  ids = np.arange(1_000) % 4  # rows 0-3 only: no other row can pass the threshold
  history = model.fit(private.poisson_dataset(ids, np.ones((ids.size, 1), np.float32),
                                              epochs=0.1), verbose=0)
  moved = np.flatnonzero(np.any(table.numpy() != before, axis=1))
  accumulator = model.optimizer.get_slot(table, "accumulator").numpy()
  assert accumulator.shape == (50,)
  assert set(moved) <= set(range(4)) and moved.size > 0, history.history
  assert np.all(accumulator[4:] == 0.1) and np.all(accumulator[moved] > 0.1)
  assert private.epsilon() > 0
  with pytest.raises(UpdateOutsideDPStepError):
    model.optimizer.apply_gradients([(tf.zeros([50, 4]), table)])


def test_the_tpu_engine_refuses_rowwise_adagrad_naming_the_flag_and_the_alternatives():
  with pytest.raises(ValueError, match=r"--optimizer rowwise-adagrad.*--embedding cpu.*adagrad"):
    engine_optimizer(RowwiseAdagrad(0.1))
