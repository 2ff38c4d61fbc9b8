"""Optimizers whose embedding updates touch only the rows of a sparse gradient.

Keras 2.15's new optimizers apply an ``IndexedSlices`` gradient to the whole table, and the
legacy ``Adam`` rescales both moment tables in full every step (docs/private-models.md,
"Optimizers"): O(vocabulary) per step either way. The legacy ``SGD`` and ``Adagrad`` update
only the gradient's rows, and :class:`LazyAdam` does so for Adam. :class:`RowwiseAdagrad`
keeps one accumulator per table row (FBGEMM's ``EXACT_ROWWISE_ADAGRAD``).

**Lazy semantics** (TF Addons' ``LazyAdam``): a row with a gradient this step takes
``m <- beta1 m + (1 - beta1) g``, ``v <- beta2 v + (1 - beta2) g^2`` and moves by
``lr_t m / (sqrt(v) + eps)`` (bias-corrected ``lr_t``); a row without one, or whose gradient is
exactly zero (the padding of a DP step's fixed-capacity update), keeps its moments and weights.
Decoupled weight decay (AdamW; Anil et al., Findings of EMNLP 2022, Algorithm 1) applies to the
updated rows only, and to dense weights every step. See docs/optimizers.md.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.embedding_tables import is_embedding_table

_LOG = logging.getLogger(__name__)
_legacy = keras.optimizers.legacy

class _DistinctRowsUpdate:
  """Applies an update over every row of a table without Keras's deduplication.

  Keras's legacy optimizers sum a sparse gradient's repeated indices before
  ``_resource_apply_sparse`` (``tf.unique`` and a segment sum: a temporary the size of the
  update). DP-SGD's update of a large table (:mod:`sparse_dp.mechanisms.noise.dense_noise`) is
  ``tf.IndexedSlices`` over every row, indices ``0 .. V-1``: distinct, and the segment sum
  would be a copy of a table's size. An update with as many indices as the table has
  rows, strictly increasing (checked when the step runs), is applied as it is; any other
  goes through Keras's deduplication. Both give the same update.
  """

  def _resource_apply_sparse_duplicate_indices(self, grad, handle, indices, **kwargs):
    deduplicated = super()._resource_apply_sparse_duplicate_indices  # type: ignore[misc]
    if indices.shape.rank != 1 or indices.shape[0] != handle.shape[0]:
      return deduplicated(grad, handle, indices, **kwargs)

    def as_it_is():
      with tf.control_dependencies([self._resource_apply_sparse(grad, handle, indices, **kwargs)]):
        return tf.constant(True)

    def summed():
      with tf.control_dependencies([deduplicated(grad, handle, indices, **kwargs)]):
        return tf.constant(False)

    return tf.cond(tf.reduce_all(indices[1:] > indices[:-1]), as_it_is, summed)


@keras.utils.register_keras_serializable(package="sparse_dp")
class LazyAdam(_DistinctRowsUpdate, _legacy.Adam):
  """Adam (optionally AdamW) that updates only the rows of sparse gradients.

  Its semantics are lazy, as TF Addons' ``LazyAdam``.
  A row with a gradient this step takes ``m <- beta1 m + (1 - beta1) g`` and
  ``v <- beta2 v + (1 - beta2) g^2``.
  It moves by ``lr_t m / (sqrt(v) + eps)``, with the bias-corrected ``lr_t``.
  A row without a gradient keeps its moments and weights.
  So does a row whose gradient is exactly zero, the padding of a DP step's fixed-capacity
  update.
  Decoupled weight decay (AdamW; Anil et al., Findings of EMNLP 2022, Algorithm 1) subtracts
  ``lr * weight_decay * w``, ``lr`` without the bias correction.
  It applies to the updated rows only, and to dense weights every step.
  See docs/optimizers.md.

  Args:
    learning_rate (float | keras.optimizers.schedules.LearningRateSchedule): ``lr``.
    beta_1 (float): ``beta1``, the first moment's decay.
    beta_2 (float): ``beta2``, the second moment's decay.
    epsilon (float): ``eps``.
    weight_decay (float): the decoupled weight decay, >= 0; 0 is Adam.
    name (str): the optimizer's name.
    **kwargs (Any): the arguments of a legacy Keras optimizer, such as ``clipnorm``.

  Raises:
    ValueError: a negative ``weight_decay``.
  """

  def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
               weight_decay=0.0, name="LazyAdam", **kwargs):
    super().__init__(learning_rate=learning_rate, beta_1=beta_1, beta_2=beta_2,
                     epsilon=epsilon, amsgrad=False, name=name, **kwargs)
    if weight_decay < 0:
      raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
    self.weight_decay = float(weight_decay)

  def _decay(self, var, values, apply_state):
    if not self.weight_decay:
      return 0.0
    lr = self._decayed_lr(var.dtype)
    return lr * self.weight_decay * values

  def _resource_apply_dense(self, grad, var, apply_state=None):
    decay = self._decay(var, var, apply_state)
    update = super()._resource_apply_dense(grad, var, apply_state)
    if not self.weight_decay:
      return update
    with tf.control_dependencies([update]):
      return var.assign_sub(decay)

  def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
    var_device, var_dtype = var.device, var.dtype.base_dtype
    coefficients = ((apply_state or {}).get((var_device, var_dtype))
                    or self._fallback_apply_state(var_device, var_dtype))
    m, v = self.get_slot(var, "m"), self.get_slot(var, "v")
    m_before, v_before = tf.gather(m, indices), tf.gather(v, indices)
    moves = tf.reduce_any(tf.not_equal(grad, 0), axis=-1, keepdims=True)
    m_rows = (coefficients["beta_1_t"] * m_before
              + coefficients["one_minus_beta_1_t"] * grad)
    v_rows = (coefficients["beta_2_t"] * v_before
              + coefficients["one_minus_beta_2_t"] * tf.square(grad))
    step = coefficients["lr"] * m_rows / (tf.sqrt(v_rows) + coefficients["epsilon"])
    step += self._decay(var, tf.gather(var, indices), apply_state)
    # Keras sums repeated indices before this call: each row is written once.
    return tf.group(m.scatter_update(tf.IndexedSlices(tf.where(moves, m_rows, m_before), indices)),
                    v.scatter_update(tf.IndexedSlices(tf.where(moves, v_rows, v_before), indices)),
                    var.scatter_sub(tf.IndexedSlices(tf.where(moves, step, tf.zeros_like(step)),
                                                     indices)))

  def get_config(self):
    config = super().get_config()
    config.pop("amsgrad", None)
    return {**config, "weight_decay": self.weight_decay}


@keras.utils.register_keras_serializable(package="sparse_dp")
class RowwiseAdagrad(_DistinctRowsUpdate, _legacy.Optimizer):
  r"""Adagrad with one accumulator per embedding-table row.

  It is FBGEMM's ``EXACT_ROWWISE_ADAGRAD`` and TorchRec's row-wise Adagrad.
  For a table of :class:`sparse_dp.layers.Embedding` (``R`` rows of dimension
  ``d``) the state is one float per row, ``a`` of shape ``[R]``, instead of
  Adagrad's ``[R, d]``. For each row ``r`` of the update, with gradient row
  ``g_r``::

      a_r <- a_r + mean_j(g_rj^2)
      w_r <- w_r - lr * g_r / (sqrt(a_r) + eps)

  The step runs on the rows of a sparse (``IndexedSlices``) update only.
  It gathers and scatters those rows, and makes no temporary of the table's or the
  accumulator's size, so it compiles with XLA (``jit_compile=True``).
  A row absent from the update keeps its weights and accumulator.
  So does a row whose gradient is zero in every coordinate (the padding of a DP step's
  fixed-capacity update, :mod:`sparse_dp.mechanisms.rows.padding`): ``mean_j(0) = 0`` and a
  zero step.
  Keras sums repeated indices before the step, so a row is updated once per step with the sum
  of its gradients.
  A dense gradient of a table (DP-SGD's, noise on every row) updates every row by the same
  rule.

  Every other variable (Dense kernels and biases, tables of other layers)
  takes ordinary element-wise Adagrad, ``a <- a + g^2``,
  ``w <- w - lr * g / (sqrt(a) + eps)`` (Keras's ``Adagrad``), with the same
  row-sparse treatment of sparse gradients.

  The accumulator starts at ``initial_accumulator_value`` (as Keras's
  ``Adagrad``). Row-wise, a row's coordinates share one step size, set by the
  mean of their squared gradients; element-wise Adagrad would give each its
  own. The Gaussian noise of a DP update has the same variance in every
  coordinate, so at high noise the two scale alike.

  Args:
    learning_rate (float | keras.optimizers.schedules.LearningRateSchedule): ``lr``.
    initial_accumulator_value (float): the accumulators' start, >= 0.
    epsilon (float): ``eps``, > 0.
    name (str): the optimizer's name.
    **kwargs (Any): the arguments of a legacy Keras optimizer, such as ``clipnorm``.

  Raises:
    ValueError: a negative ``initial_accumulator_value``, or ``epsilon <= 0``.
  """

  _HAS_AGGREGATE_GRAD = True

  def __init__(self, learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-7,
               name="RowwiseAdagrad", **kwargs):
    if initial_accumulator_value < 0.0:
      raise ValueError("initial_accumulator_value must be >= 0, got "
                       f"{initial_accumulator_value}")
    if not epsilon > 0:
      raise ValueError(f"epsilon must be > 0, got {epsilon}")
    super().__init__(name, **kwargs)
    self._set_hyper("learning_rate", kwargs.get("lr", learning_rate))
    self._initial_accumulator_value = float(initial_accumulator_value)
    self.epsilon = float(epsilon)

  def _create_slots(self, var_list):
    for var in var_list:
      self.add_slot(var, "accumulator", keras.initializers.Constant(
          self._initial_accumulator_value), shape=_accumulator_shape(var))

  def _steps(self, var, grad, accumulator):
    """The accumulator after ``grad`` and the weights' step, for rows or coordinates."""
    lr = self._decayed_lr(var.dtype.base_dtype)
    if accumulator.shape.rank == 1 and grad.shape.rank == 2:  # a table's rows
      accumulator = accumulator + tf.reduce_mean(tf.square(grad), axis=-1)
      return accumulator, lr * grad / (tf.expand_dims(tf.sqrt(accumulator), -1) + self.epsilon)
    accumulator = accumulator + tf.square(grad)
    return accumulator, lr * grad / (tf.sqrt(accumulator) + self.epsilon)

  def _resource_apply_dense(self, grad, var, apply_state=None):
    slot = self.get_slot(var, "accumulator")
    accumulator, step = self._steps(var, grad, slot.read_value())
    return tf.group(slot.assign(accumulator), var.assign_sub(step))

  def _resource_apply_sparse(self, grad, var, indices, apply_state=None):
    # Keras sums repeated indices before this call: each row is written once.
    slot = self.get_slot(var, "accumulator")
    accumulator, step = self._steps(var, grad, tf.gather(slot, indices))
    return tf.group(slot.scatter_update(tf.IndexedSlices(accumulator, indices)),
                    var.scatter_sub(tf.IndexedSlices(step, indices)))

  def get_config(self):
    return {**super().get_config(),
            "learning_rate": self._serialize_hyperparameter("learning_rate"),
            "initial_accumulator_value": self._initial_accumulator_value,
            "epsilon": self.epsilon}


def _accumulator_shape(var) -> tf.TensorShape:
  """``[rows]`` for an embedding table, the variable's own shape otherwise."""
  return var.shape[:1] if is_embedding_table(var) else var.shape


class _RestoredRowwiseAdagrad(_legacy.Optimizer):
  """What a SavedModel's :class:`RowwiseAdagrad` loads as, in place of Keras's
  ``RestoredOptimizer`` (which gives every slot its variable's shape, so a table's
  ``[rows]`` accumulator could not be restored): it holds the slots for the
  checkpoint; ``load_model`` compiles a working ``RowwiseAdagrad`` from the config."""

  def __init__(self):
    super().__init__("RestoredOptimizer")
    self._hypers_created = True

  def add_slot(self, var, slot_name, initializer="zeros", shape=None):
    return super().add_slot(var, slot_name, initializer,
                            _accumulator_shape(var) if shape is None else shape)

  def get_config(self):
    raise NotImplementedError("a RowwiseAdagrad restored from a SavedModel only holds its "
                              "slots: load it with keras.models.load_model")


def _register_saved_model_revival() -> None:
  """A SavedModel names a saved object's type by the first registered predicate it
  satisfies; Keras's ``"optimizer"`` takes every legacy optimizer, so ours goes first."""
  load = tf.__internal__.saved_model.load
  load.register_revived_type(
      "sparse_dp_rowwise_adagrad", lambda obj: isinstance(obj, RowwiseAdagrad),
      versions=[load.VersionedTypeRegistration(
          object_factory=lambda proto: _RestoredRowwiseAdagrad(), version=1,
          min_producer_version=1, min_consumer_version=1,
          setter=_RestoredRowwiseAdagrad._set_hyper)])
  from tensorflow.python.saved_model import revived_types
  order = revived_types._TYPE_IDENTIFIERS
  order.insert(0, order.pop(order.index("sparse_dp_rowwise_adagrad")))


_register_saved_model_revival()


def create_weights(optimizer: keras.optimizers.Optimizer, var_list) -> None:
  """Creates ``optimizer``'s step count, hyper-parameters and slots for ``var_list`` now.

  A legacy Keras optimizer creates them in its first ``apply_gradients``, in an
  ``init_scope``: inside a train function's first trace.
  A ``tf.function`` whose first trace creates variables is traced a second time, so every
  ``fit`` would trace its train function twice.
  The DP step of a model with many tables takes seconds to trace (the pCTR model's 26 tables:
  most of a short run).
  The weights made here are those ``apply_gradients`` would make (``_create_all_weights``, the
  legacy optimizers' own), so the updates are the same.
  A variable not in ``var_list`` still gets its slots when first updated.
  Call it within the strategy's scope the variables were made in.

  Args:
    optimizer: the model's optimizer. One that :func:`sparse_optimizer` does not return (not a
      legacy Keras optimizer) is left to create its weights as it does.
    var_list (list[tf.Variable]): the variables to make slots for.
  """
  if isinstance(optimizer, _legacy.Optimizer):
    optimizer._create_all_weights(list(var_list))


def sparse_optimizer(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
  """The same optimizer, in a form that updates only a sparse gradient's rows.

  Keras 2.15's new optimizers apply an ``IndexedSlices`` gradient to the whole table.
  The legacy ``Adam`` rescales both moment tables in full every step.
  Both are O(vocabulary) per step.

  Args:
    optimizer: the model's optimizer. Legacy ``SGD`` and ``Adagrad``, :class:`LazyAdam` and
      :class:`RowwiseAdagrad` are returned as they are. Keras 2.15's new ``SGD``, ``Adagrad``,
      ``Adam`` and ``AdamW``, and the legacy ``Adam``, become their legacy or
      :class:`LazyAdam` equivalents with the same hyper-parameters.

  Returns:
    ``optimizer`` itself, or its sparse equivalent.

  Raises:
    ValueError: any other optimizer, whose sparse updates are not verified; ``SGD`` or
      ``Adagrad`` with weight decay; or ``Adam`` with ``amsgrad=True``.
  """
  if isinstance(optimizer, (_legacy.SGD, _legacy.Adagrad, LazyAdam, RowwiseAdagrad)):
    return optimizer
  name = type(optimizer).__name__
  config = optimizer.get_config()
  lr = getattr(optimizer, "_learning_rate", None)
  if not isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
    lr = float(keras.backend.get_value(optimizer.learning_rate))
  decay = float(config.get("weight_decay") or 0.0)
  if name in ("SGD", "Adagrad") and decay:
    raise ValueError(f"optimizer {name} with weight_decay has no sparse equivalent here; "
                     "use sparse_dp.optimizers.LazyAdam(weight_decay=...) or drop the decay")
  if name == "SGD":
    converted = _legacy.SGD(lr, momentum=config["momentum"], nesterov=config["nesterov"])
  elif name == "Adagrad":
    converted = _legacy.Adagrad(lr, initial_accumulator_value=config["initial_accumulator_value"],
                                epsilon=config["epsilon"])
  elif name in ("Adam", "AdamW"):
    if config.get("amsgrad"):
      raise ValueError("Adam with amsgrad=True has no lazy sparse form; use amsgrad=False")
    converted = LazyAdam(lr, beta_1=config["beta_1"], beta_2=config["beta_2"],
                         epsilon=config["epsilon"], weight_decay=decay)
  else:
    raise ValueError(f"optimizer {name} is not supported for sparse DP training: use SGD, "
                     "Adagrad, Adam or AdamW (sparse_dp.optimizers.LazyAdam)")
  _LOG.info("sparse-dp: using %s in place of %s so that table updates stay sparse",
            type(converted).__name__, name)
  return converted
