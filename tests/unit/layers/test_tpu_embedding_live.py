"""The live TPU embedding adapter, run through a double of the mid-level API.

:class:`TPUEmbeddingAPIDouble` takes ``enqueue``/``dequeue``/``apply_gradients``
with the real ``TPUEmbedding``'s checks (TF's own, for an enqueue's inputs) and queue rules;
its tables follow :class:`EngineDouble`'s update rules. :class:`LiveEngine` drives it in
inference and training rounds, each API call in a program as on a TPU (never eagerly: the real
API reads each input's op). A traced Keras step, one program holding both rounds, is refused
as the TF-XLA bridge refuses it; DP-AdaFEST steps through the adapter, in the loop of two
programs a step, are test_tpu_two_program_loop.py's.
"""


import numpy as np
import pytest
import tensorflow as tf

from sparse_dp.layers.embedding_backends import LiveEngine
from sparse_dp.layers.embedding_backends.doubles.tpu_api_double import TPUEmbeddingAPIDouble

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


def _program(call, *args, **kwargs):
  """One API call run as its own program on graph tensors (as ``TPUTrainer``'s host enqueue):
  like the real API, the double takes no eager tensor (TF's own checks read each input's op)."""
  def program():
    inside = tf.nest.map_structure(
        lambda value: tf.identity(value) if isinstance(value, tf.Tensor) else value,
        (args, kwargs))
    result = call(*inside[0], **inside[1])
    return None if isinstance(result, tf.Operation) else result

  return tf.function(program)()


ORDER = tf.errors.InvalidArgumentError  # a call out of order fails its program


def test_the_api_double_keeps_the_real_apis_call_order():
  api = _api()
  with pytest.raises(ORDER, match="dequeue with no enqueued round"):
    _program(api.dequeue)
  _program(api.enqueue, IDS, training=False)
  _program(api.dequeue)
  with pytest.raises(ORDER, match="no dequeued training round"):
    _program(api.apply_gradients, GRADS)  # after an inference round
  _program(api.enqueue, IDS, training=True)
  with pytest.raises(ORDER, match="no dequeued training round"):
    _program(api.apply_gradients, GRADS)  # before the round's dequeue
  _program(api.dequeue)
  _program(api.enqueue, IDS, training=False)
  with pytest.raises(ORDER, match="before apply_gradients of the training round"):
    _program(api.dequeue)
  _program(api.apply_gradients, GRADS)
  assert api.calls == [("enqueue", False), ("dequeue", False), ("enqueue", True),
                       ("dequeue", True), ("enqueue", False), ("apply_gradients",)]


def test_an_enqueue_runs_tfs_own_checks_of_its_inputs():
  """As the real API: eager tensors are refused (TF reads each input's op), and so are inputs
  on a TPU device."""
  with pytest.raises(AttributeError, match="Tensor.op is undefined when eager execution"):
    _api().enqueue(IDS)
  api = _api()

  @tf.function
  def on_a_tpu_device():
    with tf.device("/device:TPU:0"):
      features = {name: tf.identity(ids) for name, ids in IDS.items()}
    api.enqueue(features)

  with pytest.raises(ValueError, match="on a TPU input device"):
    on_a_tpu_device.get_concrete_function()


def test_the_api_double_checks_structures_and_shapes_as_the_real_api():
  api = _api()
  with pytest.raises(ValueError, match="same nested structure|same structure"):
    _program(api.enqueue, {"a": IDS["a"]})  # every feature in every round
  with pytest.raises(ValueError, match="Inconsistent shape founded for input feature b"):
    _program(api.enqueue, {"a": IDS["a"], "b": tf.constant([4, 5, 6])})
  with pytest.raises(ValueError, match="last dimension as 1"):
    _program(api.enqueue, {"a": tf.zeros([3, 2], tf.int32), "b": IDS["b"]})
  with pytest.raises(ValueError, match="Non-TPU device /cpu:0"):
    _program(api.enqueue, IDS, device="/cpu:0")
  _program(api.enqueue, IDS, training=True)
  _program(api.dequeue)
  with pytest.raises(ValueError, match=r"gradient of shape \(2, 4\) at path a. Expected shape "
                                       r"\[3, 4\]"):
    _program(api.apply_gradients, {"a": tf.ones([2, D]), "b": GRADS["b"]})
  with pytest.raises(ValueError, match="not fully defined"):
    TPUEmbeddingAPIDouble(*_features()).build({"a": tf.TensorShape([None]),
                                               "b": tf.TensorShape([2])})
  with pytest.raises(RuntimeError, match="dequeue called on unbuilt"):
    TPUEmbeddingAPIDouble(*_features()).dequeue()


def test_one_dequeue_and_one_apply_gradients_per_function():
  api = _api()

  @tf.function
  def two_rounds():
    ids = {name: tf.identity(value) for name, value in IDS.items()}
    api.enqueue(ids, training=False)
    api.dequeue()
    api.enqueue(ids, training=True)
    api.dequeue()

  with pytest.raises(RuntimeError, match="should be unique within a function"):
    two_rounds()


def test_a_training_round_updates_by_the_engine_rules_and_none_is_a_zero_gradient():
  api = _api()
  before = api._variables["t"]["parameters"].numpy()
  _program(api.enqueue, {"a": tf.constant([1, 1, 3]), "b": tf.constant([4, 5])}, training=True)
  rows = _program(api.dequeue)
  np.testing.assert_array_equal(rows["a"], before[[1, 1, 3]])
  _program(api.apply_gradients, {"a": GRADS["a"], "b": None})
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

  @tf.function
  def looked_up():
    with tf.GradientTape() as tape:
      rows = engine.lookup({"a": tf.constant([2, 7])})  # b: all dummy rows
      loss = tf.reduce_sum(rows["a"] * 3.0)
    return rows["a"], tape.gradient(loss, rows["a"])

  rows, gradient = looked_up()
  np.testing.assert_array_equal(rows, table[[2, 7]])  # the anchor adds exactly 0
  np.testing.assert_array_equal(gradient, np.full([2, D], 3.0))
  _program(engine.apply_gradients, {"a": tf.constant([2]), "b": tf.constant([7])},
           {"a": tf.ones([1, D]), "b": tf.ones([1, D])})
  changed = np.flatnonzero(np.any(engine.slots("t")["parameters"].numpy() != table, axis=1))
  assert changed.tolist() == [2, 7]  # the dummy row 10 took zero gradients
  assert engine.api.calls == [("enqueue", False), ("dequeue", False), ("enqueue", True),
                              ("dequeue", True), ("apply_gradients",)]
  with pytest.raises(ValueError, match="feature b has more ids than its static TPU bound 3"):
    _program(engine.lookup, {"b": tf.constant([1, 2, 3, 4])})
  with pytest.raises(tf.errors.InvalidArgumentError, match="feature b has more ids than its "
                                                           "static TPU bound 3"):
    tf.function(engine.lookup, input_signature=[{"b": tf.TensorSpec([None], tf.int32)}])(
        {"b": tf.constant([1, 2, 3, 4])})
  with pytest.raises(ValueError, match=r"no static input bound for features \['b'\]"):
    LiveEngine(*_features(), {"a": 5}, api_factory=TPUEmbeddingAPIDouble)


def _error(call) -> str:
  with pytest.raises(ValueError) as error:
    call()
  return str(error.value).rstrip()


def test_the_doubles_shape_errors_are_the_real_apis():
  """The real object's own checks (``tpu_embedding_v2.py``), run off TPU where they run."""

  real = API.TPUEmbedding(*_features())
  real._output_shapes = [tf.TensorShape([3]), tf.TensorShape([2])]
  double = _api()
  wrong = {"a": IDS["a"], "b": tf.constant([4, 5, 6])}
  # A program's error ends with the real one's message (after the traceback of the user code).
  assert _error(lambda: _program(double.enqueue, wrong)).endswith(_error(
      lambda: real._check_output_shapes(real._get_output_shapes_from_input_shapes(
          [tf.TensorShape([3]), tf.TensorShape([3])]))))
  wide = tf.zeros([3, 2], tf.int32)
  assert _error(lambda: _program(double.enqueue, {"a": wide, "b": IDS["b"]})).endswith(_error(
      lambda: real._get_input_shape_for_tensor(wide, None, True, "a")))
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
