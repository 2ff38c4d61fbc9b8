"""A double of the mid-level ``TPUEmbedding`` object as it behaves under a ``TPUStrategy``.

Off TPU, ``tf.tpu.experimental.embedding.TPUEmbedding`` refuses ``enqueue``,
``dequeue`` and ``apply_gradients`` ("not valid when TPUEmbedding object is not
created under a TPUStrategy"). :class:`TPUEmbeddingAPIDouble` takes those calls
with the checks and error conditions of the real code
(``tensorflow/python/tpu/tpu_embedding_v2.py``, TF 2.15 and 2.21, function named
at each check below) and the engine's queue discipline, and keeps its tables in
:class:`~sparse_dp.layers.embedding_backends.engine_double.EngineDouble` (the
engine's update rules). Modelled:

* ``build``: per-replica input shapes to output shapes
  (``_get_output_shapes_from_input_shapes``: rank 1 kept, else the last axis
  dropped), which must be fully defined (``_check_output_shapes_fully_defined``);
* ``enqueue``: the structure of ``feature_config`` (``nest.assert_same_structure``),
  dense ids of rank >= 1 with a last axis of 1 from rank 2
  (``_get_input_shape_for_tensor``), the same output shapes as every earlier
  round (``_check_output_shapes``), a TPU ``device`` if any; no weights (a
  dense input takes none: ``_add_data_for_tensor``);
* ``dequeue`` and ``apply_gradients``: refused before ``build`` (their
  ``RuntimeError``); gradients of the structure and of shape
  ``output_shape + [dim]`` or ``None`` (zeros), as ``apply_gradients`` checks;
* the queue: a dequeue takes the oldest enqueued round (with none, the
  ``RecvTPUEmbeddingActivations`` op would wait forever); ``apply_gradients``
  follows the dequeue of a ``training=True`` round, and a training round
  dequeued must get its gradients before the next dequeue (``enqueue``'s
  docstring: otherwise "an error ... or the tpu may deadlock");
* one ``dequeue`` and one ``apply_gradients`` per function: "should be unique
  within a function" (``rewrite_tpu_embedding_ops.cc``, ``GetOp``); the double
  takes the innermost traced function for the TPU program (which on a TPU is
  the ``strategy.run`` body inside it); eager calls are each their own.

The queue and the state between calls are TensorFlow variables (a ring of
``_CAPACITY`` rounds with counters of rounds enqueued and dequeued, and the
dequeued training round's ids), as the engine's are device state: a round
enqueued by one ``tf.function`` (the host program) is dequeued by another (a
TPU program), a traced function repeats its calls each time it runs, and a
program compiled with XLA (``tf.function(jit_compile=True)``, as a TPU compiles
every program) reads and writes them as a TPU program does the engine's.
Call-order errors are ``RuntimeError`` eagerly and fail the function
(``InvalidArgumentError``) when traced; ``calls`` is logged when each call runs.
Inside a program XLA compiles, the call-order asserts and the log are
compiled away (XLA has no ``Assert`` and no Python callback), as a TPU has
neither; the call order of the same programs is checked without XLA.

Not modelled: sparse and ragged inputs, weights, several replicas or cores per
replica, pipelining, and the checks that need a TPU replicate context (inputs
of an enqueue inside ``strategy.run`` taken directly from its arguments, no
XLA control flow around it, inputs on the host).
"""

from __future__ import annotations

import weakref

import tensorflow as tf
from tensorflow.python.util import nest  # the real API's nest (flatten_with_joined_string_paths)

from sparse_dp.layers.embedding_backends.engine_double import EngineDouble
from sparse_dp.mechanisms.scans import compiling_with_xla

_DEADLOCK = "on a TPU the engine would wait forever (deadlock)"
_CAPACITY = 8  # rounds the double's queue holds; the engine's is a few (pipelining)


def _require(condition, message: str) -> list:
  """``RuntimeError(message)`` now if eager and ``condition`` fails; else an assertion op.

  None inside a program XLA compiles (which would compile it to nothing).
  """
  if tf.executing_eagerly():
    if not bool(condition):
      raise RuntimeError(message)
    return []
  return [] if compiling_with_xla() else [tf.debugging.Assert(condition, [message])]


class TPUEmbeddingAPIDouble:
  """``enqueue``/``dequeue``/``apply_gradients``/``build`` of the mid-level API, off TPU.

  ``calls`` logs each call: ``("enqueue", training)``, ``("dequeue", training)``,
  ``("apply_gradients",)``.
  """

  def __init__(self, feature_config, optimizer):
    self._feature_config = feature_config
    self._storage = EngineDouble(feature_config, optimizer)
    self._output_shapes = [f.output_shape for f in tf.nest.flatten(feature_config)]
    self._built = False
    self._ring = None  # variables: the last _CAPACITY rounds enqueued (training, ids...)
    self._enqueued = self._dequeued = None  # variables: rounds enqueued, dequeued so far
    self._awaiting_gradients = None  # variable: a training round was dequeued, no gradients yet
    self._dequeued_ids = []  # variables: the last dequeued round's ids, per feature
    self._programs = weakref.WeakKeyDictionary()  # traced function -> calls made in it
    self.calls = []

  @property
  def _variables(self) -> dict:
    return {table.name: self._storage.slots(table.name)
            for table in self._storage._table_config}  # pylint: disable=protected-access

  @property
  def checkpointable(self) -> EngineDouble:
    """The tables and slots, saved under the keys the API object saves them under."""
    return self._storage

  def build(self, per_replica_input_shapes=None, per_replica_batch_size=None):
    if self._built:
      return
    del per_replica_batch_size  # deprecated in the API; not used by sparse-dp
    if per_replica_input_shapes is not None:
      tf.nest.assert_same_structure(tf.nest.flatten(per_replica_input_shapes),
                                    tf.nest.flatten(self._feature_config))
      self._update_output_shapes(tf.nest.flatten(per_replica_input_shapes))
    for path, shape in zip(self._paths(), self._output_shapes):
      if not tf.TensorShape(shape).is_fully_defined():
        raise ValueError(f"Input Feature {path} has output shape set as {shape} which is not "
                         "fully defined. Please specify the fully defined shape in either "
                         "FeatureConfig or for the build method.")
    self._storage.build()
    self._ring = ([tf.Variable(tf.zeros([_CAPACITY], tf.bool), trainable=False)]
                  + [tf.Variable(tf.zeros([_CAPACITY] + list(shape), tf.int32), trainable=False)
                     for shape in self._output_shapes])
    self._enqueued = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="enqueued")
    self._dequeued = tf.Variable(tf.constant(0, tf.int64), trainable=False, name="dequeued")
    self._awaiting_gradients = tf.Variable(False, trainable=False, name="awaiting_gradients")
    self._dequeued_ids = [tf.Variable(tf.zeros(shape, tf.int32), trainable=False)
                          for shape in self._output_shapes]
    self._built = True

  def enqueue(self, features, weights=None, training: bool = True, name=None, device=None):
    del name
    tf.nest.assert_same_structure(self._feature_config, features)
    if weights is not None:
      raise ValueError("Weight specified for dense input, which is not allowed. Weight will "
                       "always be 1 in this case.")
    if device is not None and tf.DeviceSpec.from_string(device).device_type != "TPU":
      raise ValueError(f"Non-TPU device {device} passed to enqueue.")
    shapes = [self._input_shape(path, t) for path, t in zip(self._paths(),
                                                              tf.nest.flatten(features))]
    if not self._built:
      with tf.init_scope():
        self.build(shapes)
    self._check_output_shapes(shapes)
    ids = [tf.reshape(tf.cast(t, tf.int32), shape)
           for t, shape in zip(tf.nest.flatten(features), self._output_shapes)]
    with tf.control_dependencies(_require(self._queued() < _CAPACITY,
                                          f"more than {_CAPACITY} rounds enqueued")):
      slot = [[self._enqueued % _CAPACITY]]
      for held, value in zip(self._ring, [tf.constant(bool(training))] + ids):
        held.scatter_nd_update(slot, value[None])
      self._enqueued.assign_add(1)
    self._log("enqueue", tf.constant(bool(training)))

  def dequeue(self, name=None):
    del name
    if not self._built:
      raise RuntimeError("dequeue called on unbuilt TPUEmbedding object. Please either call "
                         "enqueue first or manually call the build method.")
    self._once_per_function("RecvTPUEmbeddingActivations")
    checks = _require(tf.logical_not(self._awaiting_gradients),
                      f"dequeue before apply_gradients of the training round dequeued last: "
                      f"{_DEADLOCK}")
    checks += _require(self._queued() > 0,
                       f"dequeue with no enqueued round: {_DEADLOCK}")
    with tf.control_dependencies(checks):
      slot = self._dequeued % _CAPACITY
      training, *flat_ids = [tf.gather(held, slot) for held in self._ring]
      self._dequeued.assign_add(1)
    names = self._paths()  # a flat dict's keys, in nest's (sorted) order
    rows = self._storage.lookup(dict(zip(names, flat_ids)))
    activations = [tf.reshape(rows[n], list(shape) + [self._dim(n)])
                   for n, shape in zip(names, self._output_shapes)]
    for held, ids in zip(self._dequeued_ids, flat_ids):
      held.assign(ids)
    self._awaiting_gradients.assign(training)
    self._log("dequeue", training)
    return tf.nest.pack_sequence_as(self._feature_config, activations)

  def apply_gradients(self, gradients, name=None):
    del name
    if not self._built:
      raise RuntimeError("apply_gradients called on unbuilt TPUEmbedding object. Please "
                         "either call enqueue first or manually call the build method.")
    self._once_per_function("SendTPUEmbeddingGradients")
    checks = _require(self._awaiting_gradients,
                      "apply_gradients with no dequeued training round: enqueue(..., "
                      "training=True) and dequeue() first; after a training=False round "
                      f"or none, {_DEADLOCK} or fail")
    tf.nest.assert_same_structure(self._feature_config, gradients)
    names = self._paths()
    flat = []
    for path, gradient, shape in zip(names, tf.nest.flatten(gradients), self._output_shapes):
      full = list(shape) + [self._dim(path)]
      if gradient is None:
        gradient = tf.zeros(full)
      elif not isinstance(gradient, tf.Tensor):
        raise ValueError(f"found non-tensor type: {type(gradient)} at path {path}.")
      elif gradient.shape != full:
        raise ValueError(f"Found gradient of shape {gradient.shape} at path {path}. "
                         f"Expected shape {full}.")
      flat.append(gradient)
    with tf.control_dependencies(checks):
      ids = dict(zip(names, [tf.identity(held) for held in self._dequeued_ids]))
    self._storage.apply_gradients(ids, dict(zip(names, flat)))
    self._awaiting_gradients.assign(False)
    self._log("apply_gradients")

  def _queued(self) -> tf.Tensor:
    return self._enqueued - self._dequeued

  def _log(self, call: str, training=None) -> None:
    """Appends the call to ``calls`` when it runs (in a traced function, each time).

    Not in a program XLA compiles, which cannot call back into Python.
    """
    def append(*flag):
      self.calls.append((call,) + tuple(bool(f.numpy()) for f in flag))
    if tf.executing_eagerly():
      append(*([] if training is None else [training]))
    elif not compiling_with_xla():
      tf.py_function(append, [] if training is None else [training], [])

  def _paths(self) -> list:
    return [path for path, _ in nest.flatten_with_joined_string_paths(self._feature_config)]

  def _dim(self, name: str) -> int:
    return self._storage._feature_config[name].table.dim  # pylint: disable=protected-access

  @staticmethod
  def _input_shape(path: str, tensor) -> tf.TensorShape:
    if not isinstance(tensor, tf.Tensor):
      raise ValueError(f"Input {path} is of type {type(tensor)}: the double models dense "
                       "tf.Tensor ids only")
    shape = tensor.shape
    if shape.rank is None or shape.rank < 1:
      raise ValueError("Only rank 1 and above dense tensor is supported, find rank "
                       f"{shape.rank} sparse tensor for input {path}")
    if shape.rank > 1 and shape[-1] != 1:
      raise ValueError("Rank 2 or above dense tensor should have last dimension as 1 as the "
                       "last dimension will always be reduced. Instead got dense tensor as "
                       f"shape {shape.as_list()}")
    return shape

  @staticmethod
  def _output_shape(input_shape) -> tf.TensorShape:
    input_shape = tf.TensorShape(input_shape)
    return input_shape if input_shape.rank == 1 else input_shape[:-1]

  def _update_output_shapes(self, input_shapes) -> None:
    incoming = [self._output_shape(s) for s in input_shapes]
    self._check_output_shapes(input_shapes)
    self._output_shapes = [old if old else new for old, new in zip(self._output_shapes, incoming)]

  def _check_output_shapes(self, input_shapes) -> None:
    for path, old, shape in zip(self._paths(), self._output_shapes, input_shapes):
      new = self._output_shape(shape)
      if old and new and not tf.TensorShape(old).is_compatible_with(new):
        raise ValueError(f"Inconsistent shape founded for input feature {path}, Output shape "
                         f"is set to be {old}, But got incoming output shape {new}")

  def _once_per_function(self, op_name: str) -> None:
    if tf.executing_eagerly():
      return
    made = self._programs.setdefault(tf.compat.v1.get_default_graph(), set())
    if op_name in made:
      raise RuntimeError(
          f"a second {op_name} in one function: 'should be unique within a function' "
          "(rewrite_tpu_embedding_ops.cc); at most one embedding round per TPU program")
    made.add(op_name)
