"""The live TPU embedding adapter, run through a double of the mid-level API.

:class:`TPUEmbeddingAPIDouble` takes ``enqueue``/``dequeue``/``apply_gradients``
with the real ``TPUEmbedding``'s checks and queue rules; its tables follow
:class:`EngineDouble`'s update rules. :class:`LiveEngine` drives it in
inference and training rounds. DP-AdaFEST steps through the adapter give the
EngineDouble backend's tables within ``1e-6`` (the adapter runs the step
eagerly, the reference traced: other float order) and the CPU backend's
within ``2e-5`` (Adam, as in ``test_tpu_embedding_backend.py``); each step is one
inference round, then one training round. The adapter's steps run eagerly
(each API call on its own, as in a loop of two TPU programs per step): a traced
Keras step, one program holding both rounds, is refused as the TF-XLA bridge
refuses it.
"""

import functools

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers.embedding_backends import LiveEngine, TPUEmbeddingBackend
from sparse_dp.layers.embedding_backends.doubles.tpu_api_double import TPUEmbeddingAPIDouble
from sparse_dp.training.poisson.poisson_sampling import largest_plausible_batch

from support.keras_models import N, functional_model, synthetic_data

API = tf.tpu.experimental.embedding
D = 4
ADAFEST = dict(sigma1=3.0, sigma2=0.8, threshold=6.0)


def _features(optimizer=None):
  table = API.TableConfig(vocabulary_size=11, dim=D, combiner="sum", name="t",
                          initializer=lambda shape, dtype=tf.float32: tf.reshape(
                              tf.range(11 * D, dtype=dtype), shape))
  return {"a": API.FeatureConfig(table=table, name="a"),
          "b": API.FeatureConfig(table=table, name="b")}, optimizer or API.SGD(0.5)


def _api(shapes=None):
  api = TPUEmbeddingAPIDouble(*_features())
  api.build(shapes or {"a": tf.TensorShape([3]), "b": tf.TensorShape([2])})
  return api


IDS = {"a": tf.constant([1, 2, 3]), "b": tf.constant([4, 5])}
GRADS = {"a": tf.ones([3, D]), "b": tf.ones([2, D])}


def test_the_api_double_keeps_the_real_apis_call_order():
  api = _api()
  with pytest.raises(RuntimeError, match="dequeue with no enqueued round"):
    api.dequeue()
  api.enqueue(IDS, training=False)
  api.dequeue()
  with pytest.raises(RuntimeError, match="no dequeued training round"):
    api.apply_gradients(GRADS)  # after an inference round
  api.enqueue(IDS, training=True)
  with pytest.raises(RuntimeError, match="no dequeued training round"):
    api.apply_gradients(GRADS)  # before the round's dequeue
  api.dequeue()
  api.enqueue(IDS, training=False)
  with pytest.raises(RuntimeError, match="before apply_gradients of the training round"):
    api.dequeue()
  api.apply_gradients(GRADS)
  assert api.calls == [("enqueue", False), ("dequeue", False), ("enqueue", True),
                       ("dequeue", True), ("enqueue", False), ("apply_gradients",)]


def test_the_api_double_checks_structures_and_shapes_as_the_real_api():
  api = _api()
  with pytest.raises(ValueError, match="same nested structure|same structure"):
    api.enqueue({"a": IDS["a"]})  # every feature in every round
  with pytest.raises(ValueError, match="Inconsistent shape founded for input feature b"):
    api.enqueue({"a": IDS["a"], "b": tf.constant([4, 5, 6])})
  with pytest.raises(ValueError, match="last dimension as 1"):
    api.enqueue({"a": tf.zeros([3, 2], tf.int32), "b": IDS["b"]})
  with pytest.raises(ValueError, match="Non-TPU device /cpu:0"):
    api.enqueue(IDS, device="/cpu:0")
  api.enqueue(IDS, training=True)
  api.dequeue()
  with pytest.raises(ValueError, match=r"gradient of shape \(2, 4\) at path a. Expected shape "
                                       r"\[3, 4\]"):
    api.apply_gradients({"a": tf.ones([2, D]), "b": GRADS["b"]})
  with pytest.raises(ValueError, match="not fully defined"):
    TPUEmbeddingAPIDouble(*_features()).build({"a": tf.TensorShape([None]),
                                               "b": tf.TensorShape([2])})
  with pytest.raises(RuntimeError, match="dequeue called on unbuilt"):
    TPUEmbeddingAPIDouble(*_features()).dequeue()


def test_one_dequeue_and_one_apply_gradients_per_function():
  api = _api()

  @tf.function
  def two_rounds():
    api.enqueue(IDS, training=False)
    api.dequeue()
    api.enqueue(IDS, training=True)
    api.dequeue()

  with pytest.raises(RuntimeError, match="should be unique within a function"):
    two_rounds()


def test_a_training_round_updates_by_the_engine_rules_and_none_is_a_zero_gradient():
  api = _api()
  before = api._variables["t"]["parameters"].numpy()
  api.enqueue({"a": tf.constant([1, 1, 3]), "b": tf.constant([4, 5])}, training=True)
  rows = api.dequeue()
  np.testing.assert_array_equal(rows["a"], before[[1, 1, 3]])
  api.apply_gradients({"a": GRADS["a"], "b": None})
  after = api._variables["t"]["parameters"].numpy()
  expected = np.zeros_like(before)
  expected[1], expected[3] = 0.5 * 2, 0.5  # SGD(0.5) of the gradients summed per row
  np.testing.assert_array_equal(before - after, expected)


def _engine(bounds=None):
  config, optimizer = _features()
  engine = LiveEngine(config, optimizer, bounds or {"a": 5, "b": 3},
                      api_factory=TPUEmbeddingAPIDouble)
  engine.build()
  return engine


def test_live_engine_rounds_pad_to_static_bounds_and_put_activations_on_the_tape():
  engine = _engine()
  table = engine.slots("t")["parameters"].numpy()
  with tf.GradientTape() as tape:
    rows = engine.lookup({"a": tf.constant([2, 7])})  # b: all dummy rows
    loss = tf.reduce_sum(rows["a"] * 3.0)
  np.testing.assert_array_equal(rows["a"], table[[2, 7]])  # the anchor adds exactly 0
  np.testing.assert_array_equal(tape.gradient(loss, rows["a"]), np.full([2, D], 3.0))
  engine.apply_gradients({"a": tf.constant([2]), "b": tf.constant([7])},
                         {"a": tf.ones([1, D]), "b": tf.ones([1, D])})
  changed = np.flatnonzero(np.any(engine.slots("t")["parameters"].numpy() != table, axis=1))
  assert changed.tolist() == [2, 7]  # the dummy row 10 took zero gradients
  assert engine.api.calls == [("enqueue", False), ("dequeue", False), ("enqueue", True),
                              ("dequeue", True), ("apply_gradients",)]
  with pytest.raises(tf.errors.InvalidArgumentError, match="feature b has more ids than its "
                                                           "static TPU bound 3"):
    engine.lookup({"b": tf.constant([1, 2, 3, 4])})
  with pytest.raises(ValueError, match=r"no static input bound for features \['b'\]"):
    LiveEngine(*_features(), {"a": 5}, api_factory=TPUEmbeddingAPIDouble)


def _train(embedding, optimizer, live=False, eager=False, steps=3):
  ids, labels = synthetic_data()
  model = functional_model(optimizer=optimizer())
  private = sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", noise_seed=4, **ADAFEST),
                                   num_examples=N, batch_size=128, embedding=embedding)
  if live:  # the backend of make_private(embedding="engine-double"), on the live adapter
    layer, bounds = model.get_layer("ids"), private.embedding_backend.update_bounds
    inputs = {"ids": largest_plausible_batch(N, 128 / N), "ids/dp_update": bounds[layer]}
    private.embedding_backend = TPUEmbeddingBackend(
        [layer], model.optimizer, bounds, engine_factory=functools.partial(
            LiveEngine, input_bounds=inputs, api_factory=TPUEmbeddingAPIDouble))
    private.embedding_backend.attach()
  model.run_eagerly = eager
  model.fit(private.poisson_dataset(ids, labels).take(steps), verbose=0)
  return model, private.embedding_backend


def test_adafest_steps_through_the_live_adapter_give_both_backends_tables():
  """Lazy Adam: the optimizer a stray row in a training round would move (decayed moments)."""
  def optimizer():
    return keras.optimizers.Adam(0.01)

  live, backend = _train("engine-double", optimizer, live=True, eager=True)
  double, _ = _train("engine-double", optimizer)
  cpu, _ = _train("cpu", optimizer)
  assert backend.name == "tpu-api-double"
  for a, b, c in zip(live.trainable_weights, double.trainable_weights, cpu.trainable_weights):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
    np.testing.assert_allclose(a, c, atol=2e-5, rtol=0)
  layer = live.get_layer("ids")
  np.testing.assert_array_equal(backend.table_rows(layer), layer.embeddings)
  # Each step: one training round. The forward pass runs each example alone and reads the
  # layer's table, which every step keeps equal to the engine's rows (checked above).
  step = [("enqueue", True), ("dequeue", True), ("apply_gradients",)]
  assert backend.engine.api.calls == step * 3


def _error(call) -> str:
  with pytest.raises(ValueError) as error:
    call()
  return str(error.value)


def test_the_doubles_shape_errors_are_the_real_apis():
  """The real object's own checks (``tpu_embedding_v2.py``), run off TPU where they run."""

  real = API.TPUEmbedding(*_features())
  real._output_shapes = [tf.TensorShape([3]), tf.TensorShape([2])]
  double = _api()
  wrong = {"a": IDS["a"], "b": tf.constant([4, 5, 6])}
  assert _error(lambda: double.enqueue(wrong)) == _error(
      lambda: real._check_output_shapes(real._get_output_shapes_from_input_shapes(
          [tf.TensorShape([3]), tf.TensorShape([3])])))
  wide = tf.zeros([3, 2], tf.int32)
  assert _error(lambda: double.enqueue({"a": wide, "b": IDS["b"]})) == _error(
      lambda: real._get_input_shape_for_tensor(wide, None, True, "a"))
  real._output_shapes = [tf.TensorShape([None]), tf.TensorShape([2])]
  assert _error(lambda: TPUEmbeddingAPIDouble(*_features()).build(
      {"a": tf.TensorShape([None]), "b": tf.TensorShape([2])})) == _error(
          real._check_output_shapes_fully_defined)


def test_live_engine_builds_the_real_api_object_which_refuses_rounds_off_tpu():
  config, optimizer = _features()
  engine = LiveEngine(config, optimizer, {"a": 5, "b": 3})
  engine.build()
  assert engine.backend_name == "tpu" and set(engine.slots("t")) == {"parameters"}
  with pytest.raises(RuntimeError, match="enqueue is not valid when TPUEmbedding object is not "
                                         "created under a TPUStrategy"):
    engine.lookup({"a": tf.constant([1])})
