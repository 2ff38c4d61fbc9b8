"""Per-example losses of a Keras model or a TFRS model, as DP clipping needs them."""

from __future__ import annotations

import contextlib

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.layers.recording import is_recording
from sparse_dp.training.penalties import check_no_data_dependent_losses


def per_example_loss_fn(model: keras.Model):
  """``f(data) -> (losses [B], y, y_pred)`` for ``model``.

  * A ``tfrs.Model`` (anything with ``compute_loss``): its ``compute_loss``
    must return one loss per example; build its task with
    ``loss=keras.losses.<Loss>(reduction=keras.losses.Reduction.NONE)``.
  * Any other model: the loss given to ``compile``, applied without reduction.

  A loss tensor added during the forward pass (``add_loss`` in ``call``) is
  refused (:mod:`sparse_dp.training.penalties`). Inside the DP step (a
  :func:`~sparse_dp.layers.recording.recording` scope) the metrics the model
  holds (a TFRS task's) are not updated: their totals are un-noised
  statistics of the batch, and the step runs each example alone.
  """
  if hasattr(model, "compute_loss") and _is_tfrs(model):
    def tfrs_losses(data):
      with _metrics_frozen_when_recording(model):
        losses = model.compute_loss(data, training=True)
      check_no_data_dependent_losses(model)
      if losses.shape.rank != 1:
        raise ValueError(
            f"{type(model).__name__}.compute_loss returned a loss of shape {losses.shape}; "
            "DP training needs one loss per example: give its task "
            "loss=...(reduction=keras.losses.Reduction.NONE)")
      return losses, None, None
    return tfrs_losses

  loss = model.loss
  if isinstance(loss, (dict, list, tuple)) and len(loss) == 1:
    loss = next(iter(loss.values())) if isinstance(loss, dict) else loss[0]
  if loss is None or (isinstance(loss, (dict, list, tuple)) and not loss):
    raise ValueError("the model is compiled without a loss: compile it with a per-example "
                     "loss (e.g. loss=keras.losses.BinaryCrossentropy()) before training")
  if isinstance(loss, (dict, list, tuple)):
    raise ValueError(f"DP training supports one loss for one output; got {len(loss)}: "
                     "compile a single-output model with one loss")
  loss = keras.losses.get(loss)
  if isinstance(loss, keras.losses.Loss):
    config = {**loss.get_config(), "reduction": keras.losses.Reduction.NONE}
    loss = type(loss).from_config(config)

  def keras_losses(data):
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    with _metrics_frozen_when_recording(model):
      y_pred = model(x, training=True)
    check_no_data_dependent_losses(model)
    if y_pred.shape.rank == y.shape.rank + 1 and y_pred.shape[-1] == 1:
      y = y[..., None]  # else Keras squeezes [B, 1] and averages over the batch
    losses = loss(y, y_pred)
    if losses.shape.rank == 0:
      raise ValueError(f"the loss reduced labels {y.shape} and predictions {y_pred.shape} "
                       "to one number; DP training needs one loss per example")
    if losses.shape.rank > 1:
      losses = tf.reduce_mean(losses, axis=list(range(1, losses.shape.rank)))
    if sample_weight is not None:
      losses *= tf.cast(tf.reshape(sample_weight, [-1]), losses.dtype)
    return losses, y, y_pred
  return keras_losses


@contextlib.contextmanager
def _metrics_frozen_when_recording(model: keras.Model):
  """Within the block, in a DP step, every metric ``model`` holds ignores ``update_state``."""
  if not is_recording():
    yield
    return
  metrics = {m: m.update_state for m in model.submodules if isinstance(m, keras.metrics.Metric)}
  for metric in metrics:
    metric.update_state = _no_update
  try:
    yield
  finally:
    for metric, update_state in metrics.items():
      metric.update_state = update_state


def _no_update(*args, **kwargs):  # pylint: disable=unused-argument
  return tf.no_op()


def _is_tfrs(model) -> bool:
  try:
    import tensorflow_recommenders as tfrs  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  return isinstance(model, tfrs.Model)
