"""The separability probe: each example's loss must not change when another example is removed.

Run once on the first batch of the first ``fit``, before any DP step; the
model validator's dynamic half (:mod:`sparse_dp.training.checks.validation`).
"""

from __future__ import annotations

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.training.checks.model_checks import ModelValidationError
from sparse_dp.training.checks.probe_culprits import gradient_culprits, removal_culprits
from sparse_dp.training.checks.probe_noise import FixedPasses, fixed_noise
from sparse_dp.training.checks.probe_state import ProbeState, restored_state
from sparse_dp.training.checks.probe_tensors import (
  as_tensor,
  batch_size,
  close,
  not_per_example,
  probe_weights,
  rows,
  take,
)
from sparse_dp.training.checks.probe_trace import LossesOf, PerExample, Trace, trace
from sparse_dp.training.dp_step.losses import loss_name
from sparse_dp.training.dp_step.mixed_precision import float32_compute

PROBE_SIZE = 13
"""Examples of the first batch the probe looks at.

Enough for a batch mean or an in-batch softmax to show, few enough that the ``n + 2``
forward passes of the probe cost little. Prime, so that a tensor that merely happens to
have this leading dimension (a hidden size of 16, say) is rarely taken for a batch.
"""


def check_separable(model: keras.Model, leaves: list, losses_of: LossesOf, batch,
                    probe_size: int = PROBE_SIZE) -> bool:
  """Refuses a model whose examples' losses depend on each other, on a probe of one batch.

  Run eagerly, once, on the first batch, before the first DP step. It looks at the first
  ``n = min(batch size, probe_size)`` examples and runs four checks: state, attribution,
  gradients and removal (manual: *What the epsilon covers*, "The separability probe").
  Random layers draw fixed noise per example in every pass
  (:mod:`sparse_dp.training.checks.probe_noise`). Layers of a mixed policy compute in
  float32 here (:func:`~sparse_dp.training.dp_step.mixed_precision.float32_compute`):
  16-bit rounding is not coupling. No value of the batch is printed. Cost: ``n + 2``
  forward passes of ``n`` examples, plus per-layer calls when a check fails.

  Args:
    model: the model to probe.
    leaves: the layers the step records
      (:func:`sparse_dp.training.dp_step.dense_layers.trainable_leaf_layers`).
    losses_of: the step's own training-mode forward pass, ``batch -> (losses [B], y,
      y_pred)`` (:func:`sparse_dp.training.dp_step.losses.per_example_loss_fn`).
    batch (tuple or dict): ``(x, y)``, ``(x, y, sample_weight)`` or a features dict, of
      dense, ragged or sparse tensors.
    probe_size: the most examples probed.

  Returns:
    Whether the probe ran and passed. ``False`` without checking when the batch has
      fewer than 2 examples (nothing can depend on another example): call it again on a
      later batch.

  Raises:
    ModelValidationError: a check failed; the message names the innermost layer (or the
      loss) that mixes examples.
    RuntimeError: called inside a ``tf.function``.
  """
  if not tf.executing_eagerly():
    raise RuntimeError("check_separable runs eagerly, before the first DP step; it was "
                       "called inside a tf.function")
  batch = tf.nest.map_structure(as_tensor, batch)
  n = min(int(batch_size(batch)), probe_size)
  if n < 2:
    return False
  probe = take(batch, list(range(n)))
  with (restored_state(model, leaves) as state, fixed_noise(model) as passes,
        float32_compute(model)):
    with passes.over(list(range(n))):
      recorded = trace(model, leaves, losses_of, probe, n)
    _check_state(state)
    _check_attribution(recorded, n)
    _check_gradients(model, recorded, n)
    _check_removals(model, _Passes(losses_of, probe, passes, state), recorded, n)
  return True


class _Passes:
  """Forward passes of the probe on some of its examples, noise fixed, state restored after."""

  def __init__(self, losses_of: LossesOf, probe, passes: FixedPasses, state: ProbeState):
    self._losses_of, self._probe, self._passes, self._state = losses_of, probe, passes, state

  def run(self, examples: list) -> tuple:
    """``(losses, predictions)`` of a pass on ``examples`` of the probe."""
    try:
      with self._passes.over(examples):
        losses, _, predictions = self._losses_of(take(self._probe, examples))
    finally:
      self._state.restore()
    return tf.convert_to_tensor(losses), predictions


# The four checks.


def _check_state(state: ProbeState) -> None:
  changed = state.changed()
  if changed:
    raise ModelValidationError(
        "sparse-dp: the training-mode forward pass updated the variable(s) "
        f"{', '.join(changed)} from the batch; that state would be saved and released "
        "without noise. Remove the layer, freeze it (layer.trainable = False) if its "
        "state is fixed in inference mode, or make the update a function of the weights")
  state.restore()


def _check_attribution(recorded: Trace, n: int) -> None:
  problems = []
  for lookup in recorded.lookups:
    examples = lookup.example.numpy()
    if int(lookup.batch_size) != n or (examples.size and examples.max() >= n):
      problems.append(
          f"embedding layer '{lookup.layer.name}' was called on ids whose batch dimension is "
          "not the examples (ids reshaped across examples, or shared ids such as a constant "
          "candidate set), so its lookups cannot be charged to their examples; call it on "
          "per-example ids of shape [batch, ...]")
  for call in recorded.dense_calls:
    if rows(call.inputs) != n:
      problems.append(
          f"Dense layer '{call.layer.name}' was applied to a tensor whose first dimension is "
          "not the examples; DP clipping charges row b of a Dense input to example b")
  if problems:
    culprits = removal_culprits(recorded, n)
    where = f" (the layer that mixes examples: {', '.join(culprits)})" if culprits else ""
    raise ModelValidationError("sparse-dp: " + "; ".join(problems) + where)


def _check_gradients(model, recorded: Trace, n: int) -> None:
  """Check 3: ``d(sum w_i l_i)/dt_j = w_j d(sum l_i)/dt_j`` for every per-example tensor."""
  tensors = list(recorded.inputs)
  tensors += [PerExample(f"lookups of embedding layer '{lookup.layer.name}'", lookup.vectors,
                         lookup.example)
              for lookup in recorded.lookups]
  tensors += [PerExample(f"output of Dense layer '{c.layer.name}'", c.preactivation)
              for c in recorded.dense_calls]
  weights = probe_weights(n)
  with recorded.tape:
    weighted = tf.reduce_sum(weights * recorded.losses)
    total = tf.reduce_sum(recorded.losses)
  sources = [t.tensor for t in tensors]
  mixed = [t.description for t, a, b in zip(tensors, recorded.tape.gradient(weighted, sources),
                                            recorded.tape.gradient(total, sources))
           if not_per_example(a, b, weights, t.example)]
  if mixed:
    culprits = gradient_culprits(model, recorded, n) or [_outside_layers(model)]
    _refuse(culprits, n, f"one example's loss depends on another example's {mixed[0]}")


def _check_removals(model, passes: _Passes, recorded: Trace, n: int) -> None:
  """Check 4: removing example ``k`` leaves every other example's loss unchanged."""
  again, _ = passes.run(list(range(n)))
  if not close(again, recorded.losses):
    raise ModelValidationError(
        f"sparse-dp: the training-mode forward pass of model '{model.name}' gave two "
        "different losses on the same examples, with the noise of its Keras random layers "
        "fixed: it draws random numbers outside a Keras random layer (tf.random.* in a call, "
        "a Lambda or the loss), so the probe cannot check that each example's loss depends "
        "on that example alone. Draw the noise in a layer that subclasses "
        "keras.__internal__.layers.BaseRandomLayer, through self._random_generator (as "
        "Dropout and GaussianNoise do), or remove it")
  for k in range(n):
    kept = [i for i in range(n) if i != k]
    reduced, predictions = passes.run(kept)
    if not close(reduced, tf.gather(recorded.losses, kept)):
      culprits = removal_culprits(recorded, n)
      if not culprits and _same_predictions(predictions, recorded.predictions, kept):
        culprits = [f"the loss '{loss_name(model)}'"]
      _refuse(culprits or [_outside_layers(model)], n,
              "removing one example changed another example's loss")


def _same_predictions(reduced, full, kept: list) -> bool:
  """Whether a pass without some examples predicted the same for the others."""
  if reduced is None or full is None:
    return False
  return close(reduced, tf.gather(full, kept))


def _outside_layers(model) -> str:
  return f"model '{model.name}' (operations in its call or loss outside any layer)"


def _refuse(culprits: list, n: int, finding: str):
  raise ModelValidationError(
      f"sparse-dp: {' and '.join(culprits)} mixes examples: on a probe of {n} examples of "
      f"the first batch, {finding}. Per-example clipping bounds what one example can change "
      "only when each example's loss depends on that example alone; layers that normalise "
      "or centre over the batch (BatchNormalization in training mode, a Lambda over axis "
      "0), a reshape across the batch axis, in-batch negatives and losses that are not per "
      "example (subtracting the batch mean loss, weights or scales computed from the "
      "batch's labels) break the epsilon. Compute every statistic per example, or from "
      "public data")
