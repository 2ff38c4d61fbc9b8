"""Optimizers whose embedding updates touch only the rows of a sparse gradient.

Keras 2.15's new optimizers apply an ``IndexedSlices`` gradient to the whole
table, and the legacy ``Adam`` rescales both moment tables in full every step
(``../shared/NOTES.md`` §4): O(vocabulary) per step either way. The legacy
``SGD`` and ``Adagrad`` update only the gradient's rows, and :class:`LazyAdam`
does so for Adam.

**Lazy semantics** (as in TF Addons' ``LazyAdam``): for a row with a gradient
this step, ``m <- beta1 m + (1 - beta1) g`` and ``v <- beta2 v + (1 - beta2)
g^2`` and the row moves by ``lr_t m / (sqrt(v) + eps)`` with the usual bias
correction of step ``t``; a row without a gradient keeps its moments and
weights unchanged (no decay of its moments, no momentum step); so does a row
whose gradient is exactly zero in every coordinate (the padding of a DP
step's fixed-capacity update, :mod:`sparse_dp.mechanisms.padding`). With
DP-AdaFEST the rows with a gradient are exactly the selected rows (a selected
row's noisy gradient is zero with probability 0). Decoupled weight decay
``lambda`` (AdamW; Anil et al. Algorithm 1) is applied to the updated rows
only, and to dense weights every step.
"""

from __future__ import annotations

import logging

import tensorflow as tf

from sparse_dp._keras import keras

_LOG = logging.getLogger(__name__)
_legacy = keras.optimizers.legacy


@keras.utils.register_keras_serializable(package="sparse_dp")
class LazyAdam(_legacy.Adam):
  """Adam (optionally AdamW) that updates only the rows of sparse gradients."""

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


def sparse_optimizer(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
  """The same optimizer, in a form that updates only a sparse gradient's rows.

  Legacy ``SGD`` and ``Adagrad`` are returned as they are. Keras 2.15's new
  ``SGD``, ``Adagrad``, ``Adam`` and ``AdamW``, and the legacy ``Adam``, become
  their legacy or :class:`LazyAdam` equivalents with the same hyper-parameters.
  Anything else is refused: its sparse updates are not verified.
  """
  if isinstance(optimizer, (_legacy.SGD, _legacy.Adagrad, LazyAdam)):
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
