"""The TPU embedding engine double: the API's lookups, and the engine's update rules.

Lookups are checked against ``TPUEmbeddingForServing.embedding_lookup`` (the
API's own CPU code) on the same tables; one training round against the Keras
optimizers sparse-dp uses on CPU. The extra feature of
:mod:`sparse_dp.layers.embedding_backends.tpu` is checked to put Gaussian noise
of the right standard deviation on exactly the selected rows.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats
from tensorflow.python.tpu import tpu_embedding_v2  # the API's sharded variable creator

from sparse_dp import keras, mechanisms
from sparse_dp.layers import Embedding
from sparse_dp.layers.embedding_backends import EngineDouble, TPUEmbeddingBackend
from sparse_dp.layers.embedding_backends.tpu import update_feature
from sparse_dp.optimizers import LazyAdam

from support.stacks import ALPHA

API = tf.tpu.experimental.embedding
V, D = 12, 4


def _initial(shape, dtype=tf.float32):
  return tf.random.stateless_uniform(shape, [7, 1], -1.0, 1.0, dtype)


def _engine(optimizer, vocabulary=V + 1):
  table = API.TableConfig(vocabulary_size=vocabulary, dim=D, initializer=_initial,
                          combiner="sum", name="t")
  features = {"f": API.FeatureConfig(table=table, name="f"),
              "g": API.FeatureConfig(table=table, name="g")}
  engine = EngineDouble(features, optimizer)
  engine.build()
  return engine


def test_lookups_equal_tpu_embedding_for_serving_on_the_same_tables(tmp_path):
  engine = _engine(API.SGD(0.1))
  path = tf.train.Checkpoint(embedding=engine).write(str(tmp_path / "ckpt"))
  table = API.TableConfig(vocabulary_size=V + 1, dim=D, combiner="sum", name="t")
  serving = API.TPUEmbeddingForServing({"f": API.FeatureConfig(table=table),
                                        "g": API.FeatureConfig(table=table)}, API.SGD(0.1))
  tf.train.Checkpoint(embedding=serving).read(path).assert_existing_objects_matched()
  ids = {"f": tf.constant([3, 0, 12, 3]), "g": tf.constant([[1], [5]])}
  expected = serving.embedding_lookup(ids)
  got = engine.lookup(ids)
  for name in ids:
    np.testing.assert_array_equal(got[name], tf.reshape(expected[name], got[name].shape))


def _one_round(engine_optimizer, keras_optimizer, rows, grads):
  """The engine's and the Keras optimizer's tables after one update of ``rows``."""
  engine = _engine(engine_optimizer)
  variable = tf.Variable(engine.slots("t")["parameters"].numpy())
  unique, index = np.unique(rows, return_inverse=True)
  summed = tf.math.unsorted_segment_sum(grads, index, len(unique))
  keras_optimizer.apply_gradients([(tf.IndexedSlices(summed, tf.constant(unique)), variable)])
  # The same rows, split over two features, some repeated: the engine sums them.
  half = len(rows) // 2
  engine.apply_gradients({"f": rows[:half], "g": rows[half:]},
                         {"f": grads[:half], "g": grads[half:]})
  return engine, variable


ROWS = np.array([2, 7, 2, 11, 0])
GRADS = tf.random.stateless_normal([5, D], [3, 3])


@pytest.mark.parametrize("name", ["sgd", "adagrad", "adam"])
def test_one_round_equals_the_keras_sparse_optimizer_and_touches_only_its_rows(name):
  lr = 0.05
  if name == "sgd":
    pair, atol = (API.SGD(lr), keras.optimizers.legacy.SGD(lr)), 0.0
  elif name == "adagrad":
    # Keras adds epsilon=1e-7 to sqrt(acc) >= sqrt(0.1): a relative 3e-7 difference.
    pair, atol = (API.Adagrad(lr, initial_accumulator_value=0.1),
                  keras.optimizers.legacy.Adagrad(lr, initial_accumulator_value=0.1)), 1e-6
  else:
    # The engine's Adam takes the bias-corrected rate of step 1 as its learning rate.
    corrected = lr * np.sqrt(1 - 0.999) / (1 - 0.9)
    pair, atol = (API.Adam(corrected, lazy_adam=True, sum_inside_sqrt=False),
                  LazyAdam(lr)), 1e-6
  engine, variable = _one_round(*pair, tf.constant(ROWS), GRADS)
  before = _engine(pair[0]).slots("t")["parameters"].numpy()
  after = engine.slots("t")["parameters"].numpy()
  np.testing.assert_allclose(after, variable.numpy(), atol=atol, rtol=0)
  untouched = np.setdiff1d(np.arange(V + 1), ROWS)
  np.testing.assert_array_equal(after[untouched], before[untouched])
  assert np.all(np.abs(after[ROWS] - before[ROWS]) > 0)
  for slot, value in engine.slots("t").items():
    if slot != "parameters":
      initial = 0.1 if slot == "accumulators" else 0.0
      np.testing.assert_array_equal(value.numpy()[untouched], np.float32(initial))


def test_sum_inside_sqrt_differs_from_lazy_adam_by_eps_over_sqrt_v_at_most():
  lr, eps = 0.05, 1e-3
  corrected = lr * np.sqrt(1 - 0.999) / (1 - 0.9)
  inside, _ = _one_round(API.Adam(corrected, epsilon=eps, sum_inside_sqrt=True),
                         LazyAdam(lr, epsilon=eps), tf.constant(ROWS), GRADS)
  outside, _ = _one_round(API.Adam(corrected, epsilon=eps, sum_inside_sqrt=False),
                          LazyAdam(lr, epsilon=eps), tf.constant(ROWS), GRADS)
  before = _engine(API.SGD(0.1)).slots("t")["parameters"].numpy()
  step_in = before - inside.slots("t")["parameters"].numpy()
  step_out = before - outside.slots("t")["parameters"].numpy()
  sqrt_v = np.sqrt(outside.slots("t")["velocities"].numpy())
  touched = sqrt_v > 0
  # m / sqrt(v + eps^2) >= m / (sqrt(v) + eps) in size, within a relative eps / sqrt(v).
  assert np.all(np.abs(step_in[touched]) >= np.abs(step_out[touched]) * (1 - 1e-5))
  bound = np.abs(step_out[touched]) * eps / sqrt_v[touched]
  assert np.all(np.abs(step_in - step_out)[touched] <= bound * 1.01 + 1e-9)
  assert np.any(step_in != step_out)


@pytest.mark.parametrize("optimizer, message", [
    (API.Adam(0.1, lazy_adam=False), "lazy Adam"),
    (API.SGD(0.1, weight_decay_factor=0.1), "weight_decay_factor"),
    (API.Adagrad(0.1, clip_weight_max=1.0), "clip_weight_max"),
    (API.FTRL(0.1), "FTRL"),
])
def test_engine_settings_the_double_does_not_model_are_refused(optimizer, message):
  with pytest.raises(ValueError, match=message):
    _engine(optimizer)


def test_a_training_round_must_enqueue_every_feature():
  with pytest.raises(ValueError, match=r"missing \['g'\]"):
    _engine(API.SGD(0.1)).apply_gradients({"f": tf.constant([1])}, {"f": tf.zeros([1, D])})


def test_extra_feature_puts_noise_of_the_right_std_on_exactly_the_selected_rows(seed):
  """The noisy update of the tested mechanism, fed back through the extra feature.

  With a zero clipped sum and SGD at rate 1, a row moves by minus its noise.
  Over the ``n = 300 x 4`` noised coordinates, ``sum x^2 / std^2 ~ chi2(n)`` and
  ``mean(x) ~ N(0, std^2 / n)``: each is tested two-sided at ``ALPHA / 2`` (false
  failure ``<= ALPHA = 1e-6`` in all, were the seed random).
  """
  vocabulary, bound, std = 1000, 400, 0.7
  selected = tf.sort(tf.random.experimental.stateless_shuffle(
      tf.range(vocabulary, dtype=tf.int64), seed)[:300])
  empty = tf.IndexedSlices(tf.zeros([0, D]), tf.zeros([0], tf.int64), [vocabulary, D])
  noisy = mechanisms.add_row_sparse_noise(empty, selected, std, seed)
  ids, gradients = update_feature(noisy, vocabulary, bound)
  assert ids.shape == [bound] and np.all(ids.numpy()[300:] == vocabulary)
  engine = _engine(API.SGD(1.0), vocabulary + 1)
  del engine._feature_config["g"]
  before = engine.slots("t")["parameters"].numpy()
  engine.apply_gradients({"f": ids}, {"f": gradients})
  change = before - engine.slots("t")["parameters"].numpy()
  others = np.setdiff1d(np.arange(vocabulary + 1), selected.numpy())
  assert np.all(change[others] == 0)  # dummy row included
  x = change[selected.numpy()].ravel()
  n = x.size
  statistic = np.sum(x ** 2) / std ** 2
  low, high = stats.chi2.ppf(ALPHA / 4, n), stats.chi2.isf(ALPHA / 4, n)
  assert low < statistic < high, (low, statistic, high)
  assert abs(np.mean(x)) / (std / np.sqrt(n)) < stats.norm.isf(ALPHA / 4)
  np.testing.assert_allclose(x, np.asarray(noisy.values).ravel(), rtol=1e-5, atol=1e-6)


def test_a_selection_beyond_the_static_bound_fails_the_step():
  update = tf.IndexedSlices(tf.ones([5, D]), tf.range(5, dtype=tf.int64), [10, D])
  with pytest.raises(tf.errors.InvalidArgumentError, match="static bound 4"):
    update_feature(update, 10, 4)


@pytest.mark.parametrize("hosts", [1, 2, 3, 5, V + 3])
def test_the_engine_tables_initial_rows_shard_over_hosts_as_the_api_creates_them(hosts):
  """On a slice of several hosts the API's own sharded variable creator (the one
  ``TPUEmbedding`` uses under a ``TPUStrategy``) asks the initializer for each
  host's rows; the shards together are the layer's rows and the zero dummy row
  (``V + 3`` hosts: some get no row and are skipped by the API)."""
  layer = Embedding(V, D, name="ids")
  layer(tf.constant([0]))
  backend = TPUEmbeddingBackend([layer], keras.optimizers.legacy.SGD(0.1), {layer: 3})
  initializer = backend.feature_config["ids"].table.initializer
  shape = (V + 1, D)
  with tf.variable_creator_scope(
      tpu_embedding_v2.make_sharded_variable_creator(["/cpu:0"] * hosts)):
    table = tf.Variable(initial_value=functools.partial(initializer, shape, dtype=tf.float32),
                        shape=shape, dtype=tf.float32, name="ids")
  assert len(table.variables) == min(hosts, V + 1)
  np.testing.assert_array_equal(np.concatenate([v.numpy() for v in table.variables]),
                                np.concatenate([layer.embeddings.numpy(), np.zeros([1, D])]))


def test_an_engine_table_of_another_shape_is_refused_naming_the_layer():
  layer = Embedding(V, D, name="ids")
  layer(tf.constant([0]))
  backend = TPUEmbeddingBackend([layer], keras.optimizers.legacy.SGD(0.1), {layer: 3})
  with pytest.raises(ValueError, match=r"engine table of ids has 13 x 4 rows.*asked for \(12, 4\)"):
    backend.feature_config["ids"].table.initializer((V, D))
