"""A double of the mid-level ``TPUEmbedding`` object as it behaves under a ``TPUStrategy``.

Off TPU, ``tf.tpu.experimental.embedding.TPUEmbedding`` refuses ``enqueue``, ``dequeue`` and
``apply_gradients``. :class:`TPUEmbeddingAPIDouble` takes those calls with the checks and
error conditions of ``tensorflow/python/tpu/tpu_embedding_v2.py`` (TF 2.15 and 2.21) and the
engine's queue discipline (one queue per core, one ``dequeue`` and one ``apply_gradients`` per
TPU program, gradients summed over the cores), and keeps its tables in
:class:`~sparse_dp.layers.embedding_backends.doubles.engine_double.EngineDouble`. Its queue and
round state are TensorFlow variables, one copy per core, so that the host program and the TPU
programs can be separate functions, compiled with XLA or not. Call-order errors are
``RuntimeError`` eagerly and fail the function when traced. An enqueue runs TF's own checks
(control-flow context, inputs on the host, direct inputs inside a ``TPUReplicateContext``), so
like the real one it takes graph tensors only. Not modelled: sparse and ragged inputs,
weights, model parallelism, pipelining. See docs/tpu.md ("The API doubles").
"""

from __future__ import annotations

import weakref
from typing import Optional

import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v2
from tensorflow.python.util import nest  # the real API's nest (flatten_with_joined_string_paths)

from sparse_dp.layers.embedding_backends.doubles.engine_double import EngineDouble
from sparse_dp.mechanisms.rows.scans import compiling_with_xla

_V1 = tpu_embedding_v2.TPUEmbedding
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

  # TF's own checks of an enqueue: no function nested in strategy.run's TPUReplicateContext,
  # inputs on the host, and inside that context the program's direct inputs only.
  _raise_error_for_incorrect_control_flow_context = (
      _V1._raise_error_for_incorrect_control_flow_context)
  _raise_error_for_inputs_not_on_cpu = _V1._raise_error_for_inputs_not_on_cpu
  _raise_error_for_non_direct_inputs = _V1._raise_error_for_non_direct_inputs

  def __init__(self, feature_config, optimizer):
    self._feature_config = feature_config
    self._strategy = tf.distribute.get_strategy()  # the API object's, as the real one reads it
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
            for table in self._storage._table_config}

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
    self._ring = ([_core_state(tf.zeros([_CAPACITY], tf.bool))]
                  + [_core_state(tf.zeros([_CAPACITY] + list(shape), tf.int32))
                     for shape in self._output_shapes])
    self._enqueued = _core_state(tf.constant(0, tf.int64), "enqueued")
    self._dequeued = _core_state(tf.constant(0, tf.int64), "dequeued")
    self._awaiting_gradients = _core_state(tf.constant(False), "awaiting_gradients")
    self._dequeued_ids = [_core_state(tf.zeros(shape, tf.int32)) for shape in self._output_shapes]
    self._built = True

  def enqueue(self, features, weights=None, training: bool = True, name=None, device=None):
    del name
    in_tpu_context = self._raise_error_for_incorrect_control_flow_context()
    tf.nest.assert_same_structure(self._feature_config, features)
    self._raise_error_for_inputs_not_on_cpu(
        nest.flatten(features), [path for path, _ in
                                 nest.flatten_with_joined_string_paths(self._feature_config)])
    if in_tpu_context:
      self._raise_error_for_non_direct_inputs(features)
    if weights is not None:
      raise ValueError("Weight specified for dense input, which is not allowed. Weight will "
                       "always be 1 in this case.")
    cores = (range(self._strategy.num_replicas_in_sync) if device is None
             else [self._core_of(device)])
    per_core = {core: [self._on_core(t, core) if isinstance(t, tf.distribute.DistributedValues)
                       else t for t in tf.nest.flatten(features)]  # select_replica
                for core in cores}
    for core, tensors in per_core.items():
      shapes = [self._input_shape(path, t) for path, t in zip(self._paths(), tensors)]
      if not self._built:
        with tf.init_scope():
          self.build(shapes)
      self._check_output_shapes(shapes)
      ids = [tf.reshape(tf.cast(t, tf.int32), shape)
             for t, shape in zip(tensors, self._output_shapes)]
      ring, enqueued = self._on_core(self._ring, core), self._on_core(self._enqueued, core)
      queued = enqueued - self._on_core(self._dequeued, core)
      with tf.control_dependencies(_require(queued < _CAPACITY,
                                            f"more than {_CAPACITY} rounds enqueued")):
        slot = [[enqueued % _CAPACITY]]
        for held, value in zip(ring, [tf.constant(bool(training))] + ids):
          held.scatter_nd_update(slot, value[None])
        enqueued.assign_add(1)
      self._log("enqueue", tf.constant(bool(training)))

  def dequeue(self, name=None):
    del name
    if not self._built:
      raise RuntimeError("dequeue called on unbuilt TPUEmbedding object. Please either call "
                         "enqueue first or manually call the build method.")
    core = self._replica()
    self._once_per_function("RecvTPUEmbeddingActivations", core)
    awaiting = self._on_core(self._awaiting_gradients, core)
    dequeued = self._on_core(self._dequeued, core)
    checks = _require(tf.logical_not(awaiting),
                      f"dequeue before apply_gradients of the training round dequeued last: "
                      f"{_DEADLOCK}")
    checks += _require(self._on_core(self._enqueued, core) - dequeued > 0,
                       f"dequeue with no enqueued round: {_DEADLOCK}")
    with tf.control_dependencies(checks):
      slot = dequeued % _CAPACITY
      training, *flat_ids = [tf.gather(held, slot) for held in self._on_core(self._ring, core)]
      dequeued.assign_add(1)
    names = self._paths()  # a flat dict's keys, in nest's (sorted) order
    rows = self._storage.lookup(dict(zip(names, flat_ids)))
    activations = [tf.reshape(rows[n], list(shape) + [self._dim(n)])
                   for n, shape in zip(names, self._output_shapes)]
    for held, ids in zip(self._on_core(self._dequeued_ids, core), flat_ids):
      held.assign(ids)
    awaiting.assign(training)
    self._log("dequeue", training)
    return tf.nest.pack_sequence_as(self._feature_config, activations)

  def apply_gradients(self, gradients, name=None):
    del name
    if not self._built:
      raise RuntimeError("apply_gradients called on unbuilt TPUEmbedding object. Please "
                         "either call enqueue first or manually call the build method.")
    core = self._replica()
    self._once_per_function("SendTPUEmbeddingGradients", core)
    awaiting = self._on_core(self._awaiting_gradients, core)
    checks = _require(awaiting,
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
      ids = [tf.identity(held) for held in self._on_core(self._dequeued_ids, core)]
    context = tf.distribute.get_replica_context()
    if context is None:  # one core, called in the cross-replica context
      self._accumulate_and_apply(self._strategy, names, ids, flat)
    else:
      context.merge_call(self._accumulate_and_apply, args=(names, ids, flat))
    awaiting.assign(False)
    self._log("apply_gradients")

  def _accumulate_and_apply(self, strategy, names, ids, gradients) -> None:
    """The engine's update of a round: every core's ids and gradients, summed by row, once."""
    gathered = [[tf.concat(strategy.experimental_local_results(t), 0) for t in per_feature]
                for per_feature in (ids, gradients)]
    self._storage.apply_gradients(*(dict(zip(names, g)) for g in gathered))

  def _replica(self) -> int:
    """The core (replica) of the function being traced or run: a static id off TPU."""
    context = tf.distribute.get_replica_context()
    if context is None and self._strategy.num_replicas_in_sync == 1:
      return 0  # one core: a cross-replica call is its program's
    core = None if context is None else tf.get_static_value(context.replica_id_in_sync_group)
    if core is None:
      raise RuntimeError("dequeue and apply_gradients run in a replica context (strategy.run) "
                         "of a strategy with static replica ids (the double runs off TPU)")
    return int(core)

  def _core_of(self, device: str) -> int:
    """The replica of ``device``, which must be one of the strategy's (its TPU cores)."""
    devices = [tf.DeviceSpec.from_string(d) for d in _replica_devices(self._strategy)]
    spec = tf.DeviceSpec.from_string(device)
    if spec not in devices:
      raise ValueError(f"Non-TPU device {device} passed to enqueue: the double's cores are "
                       f"the strategy's replica devices {[d.to_string() for d in devices]}")
    return devices.index(spec)

  def _on_core(self, state, core: int):
    """Core ``core``'s copy of a state variable or distributed value (or of each of a list)."""
    if isinstance(state, list):
      return [self._on_core(v, core) for v in state]
    return self._strategy.experimental_local_results(state)[core]

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
    return self._storage._feature_config[name].table.dim

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

  def _once_per_function(self, op_name: str, core: int) -> None:
    """Refuses a second ``op_name`` in the TPU program a core runs (each replica runs one)."""
    if tf.executing_eagerly():
      return
    made = self._programs.setdefault(tf.compat.v1.get_default_graph(), set())
    if (op_name, core) in made:
      raise RuntimeError(
          f"a second {op_name} in one function: 'should be unique within a function' "
          "(rewrite_tpu_embedding_ops.cc); at most one embedding round per TPU program")
    made.add((op_name, core))


def _core_state(initial_value: tf.Tensor, name: Optional[str] = None) -> tf.Variable:
  """A state variable of the engine with one copy per core (replica), read and written there.

  Sync-on-read: in a replica context each replica reads and writes its own
  copy; under no strategy or one device it is an ordinary variable.
  """
  return tf.Variable(initial_value, trainable=False, name=name,
                     synchronization=tf.VariableSynchronization.ON_READ,
                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


def _replica_devices(strategy: tf.distribute.Strategy) -> list:
  """The device of each replica (none named under the default strategy)."""
  try:
    return list(strategy.extended.worker_devices)
  except RuntimeError:  # the default strategy: "worker_devices() method unsupported"
    return []
