"""DP-AdaFEST with dense tables (``DPConfig(dense_tables=...)``): noise on every row of those,
the sparse mechanisms on the others, and the same accountant."""

import functools

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding
from sparse_dp.training.dp_step import dense_layers
from sparse_dp.training.dp_step.step import StepNoise, private_gradients

from support.stacks import ALPHA

USERS, ITEMS, WIDTH, BATCH = 300, 5_000, 4, 64
SIGMA2, C2 = 0.7, 1.0


def _model():
  keras.utils.set_random_seed(1)
  user = keras.Input(shape=(), dtype=tf.int64)
  item = keras.Input(shape=(), dtype=tf.int64)
  tables = [Embedding(size, WIDTH, embeddings_initializer="zeros", name=name)(ids)
            for size, name, ids in ((USERS, "users", user), (ITEMS, "items", item))]
  model = keras.Model([user, item], keras.layers.Dense(1)(keras.layers.Concatenate()(tables)))
  model.compile(optimizer=keras.optimizers.legacy.SGD(1.0),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  return model


def _batch(examples=BATCH, seed=0):
  """Users among the first 20 rows; items among the first 3, about 21 examples each."""
  rng = np.random.default_rng(seed)
  return ((rng.integers(0, 20, examples), rng.integers(0, 3, examples)),
          rng.integers(0, 2, (examples, 1)).astype(np.float32))


@functools.lru_cache(maxsize=None)  # the tests share their graph-mode step of _noise()
def _gradients(noise, jit_compile=False, microbatch_size=None):
  model = _model()
  leaves = dense_layers.trainable_leaf_layers(model)
  (users, items), labels = _batch()
  data = ((tf.constant(users), tf.constant(items)), tf.constant(labels))

  def losses_of(batch):
    logits = model(batch[0], training=True)
    return tf.squeeze(tf.nn.sigmoid_cross_entropy_with_logits(batch[1], logits), -1), None, None

  @tf.function(jit_compile=jit_compile)
  def step(seed):
    gradients, _, stats_ = private_gradients(leaves, losses_of, data, noise, seed,
                                             microbatch_size)
    return ({name: gradients[model.get_layer(name).embeddings.ref()]
             for name in ("users", "items")}, stats_["nonzero_rows"])
  return step(tf.constant([20231122, 4], tf.int64))


def _noise(dense_tables=frozenset({"users"})):
  # tau = 12 sigma1 C1 ... at sigma1 C1 = 2: no untouched row passes (Psi(6) ~ 1e-9), the
  # three items (~21 examples each, contribution 1 each: the users left the C1 clip) pass.
  return StepNoise(gradient_multiplier=SIGMA2, contribution_multiplier=2.0, l2_norm_clip=C2,
                   contribution_clip=1.0, threshold=12.0, expected_batch_size=float(BATCH),
                   dense_tables=dense_tables)


def test_a_dense_table_gets_the_gradient_noise_on_every_row_and_a_sparse_one_on_its_selection():
  gradients, nonzero_rows = _gradients(_noise())
  users, items = gradients["users"], gradients["items"]
  np.testing.assert_array_equal(users.indices.numpy(), np.arange(USERS))
  np.testing.assert_array_equal(np.sort(items.indices.numpy()), [0, 1, 2])
  assert float(nonzero_rows) == USERS + 3
  # The rows no example touched hold only the noise: N(0, (sigma2 C2 / B)^2) per coordinate.
  z = users.values.numpy()[20:].ravel() * BATCH / (SIGMA2 * C2)
  bound = stats.norm.isf(ALPHA / 2)
  assert abs(z.mean()) * np.sqrt(z.size) < bound
  assert abs(z.var() - 1.0) / np.sqrt(2.0 / z.size) < bound
  assert stats.kstest(z, "norm").pvalue > ALPHA
  # Without dense tables the users' rows are selected as the items' are: none untouched.
  sparse, _ = _gradients(_noise(frozenset()))
  assert set(sparse["users"].indices.numpy()) <= set(range(20))


def test_a_compiled_step_gives_a_dense_table_its_whole_vocabulary_as_room():
  graph, graph_rows = _gradients(_noise())
  compiled, compiled_rows = _gradients(_noise(), jit_compile=True)
  assert compiled["users"].indices.shape == [USERS]
  assert float(compiled_rows) == float(graph_rows)
  for name, rows in (("users", USERS), ("items", ITEMS)):
    np.testing.assert_allclose(_dense(compiled[name], rows), _dense(graph[name], rows),
                               rtol=1e-5, atol=1e-7)


def _dense(gradient, rows):
  """A row-sparse gradient as a dense ``[rows, WIDTH]`` array (its PAD rows dropped)."""
  kept = gradient.indices.numpy() < rows
  dense = np.zeros((rows, WIDTH), np.float32)
  np.add.at(dense, gradient.indices.numpy()[kept], gradient.values.numpy()[kept])
  return dense


def test_a_dense_table_s_touched_rows_carry_their_clipped_gradient_in_the_joint_clip():
  """With the noise scaled away and a threshold every touched row passes, the dense table's
  update is the sparse run's: the same rows' clipped sums, clipped jointly with the others."""
  quiet = dict(gradient_multiplier=1e-6, contribution_multiplier=1e-3, l2_norm_clip=0.05,
               contribution_clip=1.0, threshold=0.5, expected_batch_size=float(BATCH))
  dense, _ = _gradients(StepNoise(**quiet, dense_tables=frozenset({"users"})))
  sparse, _ = _gradients(StepNoise(**quiet))
  assert np.abs(_dense(sparse["users"], USERS)).sum() > 0  # the touched users are updated
  for name, rows in (("users", USERS), ("items", ITEMS)):
    np.testing.assert_allclose(_dense(dense[name], rows), _dense(sparse[name], rows), atol=1e-6)


def test_micro_batches_give_a_dense_table_the_one_pass_update():
  whole, rows = _gradients(_noise())
  chunked, chunked_rows = _gradients(_noise(), microbatch_size=16)
  assert float(chunked_rows) == float(rows)
  for name, size in (("users", USERS), ("items", ITEMS)):
    np.testing.assert_allclose(_dense(chunked[name], size), _dense(whole[name], size),
                               rtol=1e-5, atol=1e-6)


def _private(model, embedding="auto", **config):
  return sparse_dp.make_private(
      model, sparse_dp.DPConfig("adafest", sigma1=2.0, sigma2=SIGMA2, threshold_sigmas=4.0,
                                noise_seed=3, **config),
      num_examples=4_096, batch_size=512, embedding=embedding)


@functools.lru_cache(maxsize=None)  # the CPU fit with a dense table serves two tests
def _fitted(dense_tables=(), embedding="cpu"):
  """One epoch of ``fit``: the trained weights, epsilon at 1e-5, the step's dense tables and
  the report (numpy values and a report, not the model)."""
  (users, items), labels = _batch(4_096)
  model = _model()
  private = _private(model, embedding, dense_tables=list(dense_tables))
  model.fit(private.poisson_dataset((users, items), labels, epochs=1), verbose=0)
  return ([_read_only(w.numpy()) for w in model.trainable_weights],
          {name: _read_only(model.get_layer(name).embeddings.numpy())
           for name in ("users", "items")},
          private.epsilon(delta=1e-5), private.step_noise.dense_tables, private.report())


def _read_only(array: np.ndarray) -> np.ndarray:
  """``array``, refusing writes: the tests that share :func:`_fitted` cannot change it."""
  array.setflags(write=False)
  return array


def test_fit_moves_every_row_of_a_dense_table_at_the_epsilon_of_the_sparse_run():
  _, _, sparse_epsilon, _, _ = _fitted()
  _, tables, epsilon, dense_tables, report = _fitted(("users",))
  assert dense_tables == {"users"}
  assert "Dense tables, no selection and sigma2 on every row: users." in report.statement()
  assert report.to_dict()["dense_tables"] == ["users"]
  assert np.all(tables["users"] != 0)
  moved = np.any(tables["items"] != 0, axis=1)
  assert 0 < moved.sum() < 50
  assert epsilon == sparse_epsilon > 0


def test_auto_makes_the_tables_no_larger_than_a_batch_dense():
  config = sparse_dp.DPConfig("adafest", sigma1=2.0, sigma2=SIGMA2, dense_tables="auto")
  assert config.dense_table_names([("users", 512), ("items", 513)], 512.0) == {"users"}
  assert _private(_model(), dense_tables="auto").step_noise.dense_tables == {"users"}
  dpsgd = sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0, dense_tables="auto")
  assert dpsgd.dense_table_names([("users", 1)], 512.0) == frozenset()  # every row already
  assert sparse_dp.DPConfig("adafest", sigma1=1.0, sigma2=1.0,
                            dense_tables=None).dense_tables == ()


@pytest.mark.parametrize("dense_tables, message", [
    (["user"], r"names \['user'\], not Embedding layers of the model: its tables are "
               r"\['items', 'users'\]"),
    (["users", "items"], "makes all 2 tables of the model dense, .* use algorithm 'dpsgd'"),
])
def test_a_wrong_table_name_or_no_sparse_table_is_refused_before_the_model_changes(
    dense_tables, message):
  model = _model()
  step = model.train_step
  with pytest.raises(ValueError, match=message):
    _private(model, dense_tables=dense_tables)
  assert model.train_step == step


@pytest.mark.parametrize("algorithm", ["adafest", "dpsgd"])
def test_a_name_of_no_table_or_of_two_tables_is_refused_for_every_algorithm(algorithm):
  config = sparse_dp.DPConfig(algorithm, sigma1=1.0, sigma2=1.0, noise_multiplier=1.0,
                              dense_tables=["user"])
  with pytest.raises(ValueError, match=r"names \['user'\], not Embedding layers"):
    config.dense_table_names([("users", 10), ("items", 10)], 64.0)
  with pytest.raises(ValueError, match=r"several Embedding layers named \['users'\]"):
    config.dense_table_names([("users", 10), ("users", 10), ("items", 10)], 64.0)


@pytest.mark.parametrize("dense_tables", ["users", [3], 3])
def test_dense_tables_is_auto_or_a_list_of_names(dense_tables):
  with pytest.raises(ValueError, match="'auto' or a list of Embedding layer names"):
    sparse_dp.DPConfig("adafest", sigma1=1.0, sigma2=1.0, dense_tables=dense_tables)


def test_the_engine_double_trains_a_dense_table_as_the_cpu_backend_does():
  """Through the TPU embedding engine's terms (the update fed back per table, bounded by the
  vocabulary for a dense table) the weights are the CPU backend's."""
  cpu, _, _, _, _ = _fitted(("users",))
  engine, tables, _, _, _ = _fitted(("users",), "engine-double")
  assert len(cpu) == len(engine)
  for a, b in zip(cpu, engine):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  assert np.all(tables["users"] != 0)
