"""Per-example losses of a Keras model or a TFRS model, as DP clipping needs them."""

from __future__ import annotations

import contextlib
import copy

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.layers.recording import is_recording
from sparse_dp.training.dp_step.penalties import check_no_data_dependent_losses

_NONE = "reduction=keras.losses.Reduction.NONE"

# How to train on several outputs: one per-example loss that sums them (docs/epsilon.md,
# "Multi-task").
MULTI_TASK_FIX = (
    "DP training clips one loss per example, so weight the outputs' losses yourself, per "
    "example, in a tfrs.Model: give each task a loss with " + _NONE + " and return their "
    "weighted sum from compute_loss, e.g. `return 1.0 * self.click_task(labels=click, "
    "predictions=p_click) + 0.5 * self.rating_task(labels=rating, predictions=p_rating)` "
    "(each [batch]); see docs/epsilon.md, 'Multi-task'")


def _own_containers(data):
  """``data`` with new dicts and lists (the same tensors), in their own key order."""
  if isinstance(data, dict):
    copied = copy.copy(data)
    for key in copied:
      copied[key] = _own_containers(copied[key])
    return copied
  if isinstance(data, list):
    return [_own_containers(part) for part in data]
  if type(data) is tuple:
    return tuple(_own_containers(part) for part in data)
  return data


def _feature_names(data) -> list:
  """The names of the features in a batch's dicts (top level and ``(x, y)``'s parts)."""
  parts = data if isinstance(data, (tuple, list)) else (data,)
  return sorted(str(name) for part in parts if isinstance(part, dict) for name in part)


def per_example_loss_fn(model: keras.Model):
  """``f(data) -> (losses [B], y, y_pred)`` for ``model``.

  * A ``tfrs.Model`` (anything with ``compute_loss``): its ``compute_loss``
    must return one loss per example; build its task with
    ``loss=keras.losses.<Loss>(reduction=keras.losses.Reduction.NONE)``.
  * Any other model: the loss given to ``compile``, applied without reduction.
    Several outputs (``loss_weights``) are refused naming the TFRS multi-task
    route (:data:`MULTI_TASK_FIX`).

  A loss tensor added during the forward pass (``add_loss`` in ``call``) is
  refused (:mod:`sparse_dp.training.dp_step.penalties`); so is a loss whose first
  dimension is not the batch's (a loss reduced to shape ``[1]``, say). Inside
  the DP step (a :func:`~sparse_dp.layers.recording.recording` scope) the
  metrics the model holds (a TFRS task's) are not updated: their totals are
  un-noised statistics of the batch, and the step runs each example alone.
  """
  if hasattr(model, "compute_loss") and _is_tfrs(model):
    def tfrs_losses(data):
      with _metrics_frozen_when_recording(model):
        try:  # its own dicts: a compute_loss that pops its labels leaves the caller's whole
          losses = model.compute_loss(_own_containers(data), training=True)
        except KeyError as missing:
          names = _feature_names(data)
          if not (missing.args and isinstance(missing.args[0], str)
                  and names and missing.args[0] not in names):
            raise
          raise ValueError(
              f"{type(model).__name__}.compute_loss reads the feature {missing.args[0]!r}, "
              f"which the batch does not have (its features: {', '.join(names)}): give the "
              "dataset that feature, or read the one it has under another name"
          ) from missing
      check_no_data_dependent_losses(model)
      if losses.shape.rank != 1:
        raise ValueError(f"{type(model).__name__}.compute_loss returned a loss of shape "
                         f"{losses.shape}; DP training needs one loss per example: "
                         f"{_tfrs_reduction_fix(model)}")
      _check_one_per_example(losses, tf.nest.flatten(data)[0],
                             f"{type(model).__name__}.compute_loss")
      return losses, None, None
    return tfrs_losses

  loss = model.loss
  if isinstance(loss, (dict, list, tuple)) and len(loss) == 1:
    loss = next(iter(loss.values())) if isinstance(loss, dict) else loss[0]
  if loss is None or (isinstance(loss, (dict, list, tuple)) and not loss):
    raise ValueError("the model is compiled without a loss: compile it with a per-example "
                     "loss (e.g. loss=keras.losses.BinaryCrossentropy()) before training")
  if isinstance(loss, (dict, list, tuple)):
    weights = getattr(model.compiled_loss, "_user_loss_weights", None)
    outputs = len(model.outputs or loss)
    raise ValueError(
        f"DP training takes one loss; got {len(loss)} for the {outputs} output(s) of model "
        f"'{model.name}'{' with loss_weights' if weights else ''}: " +
        (MULTI_TASK_FIX if outputs > 1 else "compile it with one per-example loss"))
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
    _check_one_per_example(losses, y_pred, f"the loss '{loss_name(model)}'")
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


def _no_update(*args, **kwargs):
  return tf.no_op()


def _check_one_per_example(losses: tf.Tensor, batch: tf.Tensor, source: str) -> None:
  """Refuses ``losses`` whose static first dimension is not ``batch``'s (shape ``[1]``, say).

  A per-example loss has the batch's first dimension: the same number, or
  unknown like the batch's while a step is traced.
  """
  rows, examples = losses.shape[0], batch.shape[0]
  if rows is not None and rows != examples:
    raise ValueError(
        f"{source} returned losses of shape {losses.shape} for a batch of "
        f"{examples if examples is not None else 'any number of'} examples: DP training "
        "clips one loss per example, so the loss must return shape [batch]; compute it "
        "per example without reducing over the batch (a keras.losses.Loss with "
        f"{_NONE}, or a function that reduces over the last axis only, like "
        "keras.losses.binary_crossentropy)")


def _tfrs_reduction_fix(model) -> str:
  """The fix for a scalar ``compute_loss``: the tasks' reduction, else the labels' shape."""
  losses = [getattr(task, "_loss", None) for task in _tfrs_tasks(model)]
  reductions = [loss.reduction for loss in losses if isinstance(loss, keras.losses.Loss)]
  if reductions and all(r == keras.losses.Reduction.NONE for r in reductions):
    return ("its task's loss already has reduction NONE, so the labels' shape reduced it: "
            "Keras losses average over the last axis, and labels of shape [batch] (against "
            "predictions [batch, 1] or [batch]) make that axis the batch; pass labels and "
            "predictions of shape [batch, 1] (labels[:, None], or tf.reshape(labels, [-1, 1]))")
  return f"give its task loss=...({_NONE})"


def _tfrs_tasks(model) -> list:
  import tensorflow_recommenders as tfrs
  layers = model._flatten_layers(include_self=False)
  return [layer for layer in layers if isinstance(layer, tfrs.tasks.Ranking)]


def _is_tfrs(model) -> bool:
  try:
    import tensorflow_recommenders as tfrs
  except ImportError:
    return False
  return isinstance(model, tfrs.Model)


def loss_name(model: keras.Model) -> str:
  """The name of ``model``'s loss, as errors and the separability probe cite it."""
  loss = getattr(model, "loss", None)
  return getattr(loss, "name", None) or getattr(loss, "__name__", None) or repr(loss)
