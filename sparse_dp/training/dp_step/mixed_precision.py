"""Mixed precision in DP training: 16-bit compute, a float32 mechanism, a fixed loss scale.

Under a Keras mixed policy (``mixed_bfloat16``, ``mixed_float16``) each example's forward and
backward pass run in the layers' 16 bits, and what leaves the per-example program (``l_i``,
the activation gradients, the ``Dense`` inputs) is cast to float32
(:mod:`sparse_dp.training.dp_step.per_example`): the norms, the clipping to ``C2``, the
selection and the noise ``N(0, sigma^2 C2^2)`` are float32, so the mechanism and its epsilon
are the float32 ones. Under ``mixed_float16`` each example's loss is multiplied by a **fixed**
scale ``S`` (a ``LossScaleOptimizer(inner, dynamic=False, initial_scale=S)``; a dynamic one is
refused: it is state computed from the private batch) and its gradients are divided by ``S``
in float32 before the norms; an example whose gradient overflows is zeroed like any
non-finite one. The separability probe runs the same layers in float32
(:func:`float32_compute`). See docs/epsilon.md ("Mixed precision").
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from sparse_dp._keras import keras

_LOSS_SCALE_OPTIMIZER = keras.mixed_precision.LossScaleOptimizer
_LOW_PRECISION = ("float16", "bfloat16")


def loss_scaling_problems(optimizer, model: keras.Model) -> list[str]:
  """A dynamic loss scale, explicit or the one Keras's ``compile`` adds for ``mixed_float16``."""
  dynamic = isinstance(optimizer, _LOSS_SCALE_OPTIMIZER) and optimizer.dynamic
  implicit = (not isinstance(optimizer, _LOSS_SCALE_OPTIMIZER)
              and model.dtype_policy.name == "mixed_float16")
  if not (dynamic or implicit):
    return []
  what = ("the optimizer is a LossScaleOptimizer with dynamic=True" if dynamic else
          f"model '{model.name}' has the dtype policy 'mixed_float16', for which Keras's "
          "compile wraps the optimizer in a LossScaleOptimizer with dynamic=True")
  return [
      f"{what}: a dynamic loss scale halves when the un-noised "
      "gradients of a step overflow, state computed from the private batch without noise "
      "that shapes every later step; compile with a fixed scale, "
      "keras.mixed_precision.LossScaleOptimizer(optimizer, dynamic=False, initial_scale=S) "
      "(the DP step divides each example's gradient by S before clipping; a per-example "
      "loss is not divided by the batch size B: the scale a mean loss needed, divided by "
      "B, does)"]


def split_loss_scale(optimizer) -> tuple:
  """``(the optimizer that applies the updates, the fixed loss scale S)``: ``S = 1`` if none.

  ``optimizer`` has passed :func:`loss_scaling_problems` (no dynamic scale).
  """
  if isinstance(optimizer, _LOSS_SCALE_OPTIMIZER):
    return optimizer.inner_optimizer, float(optimizer.initial_scale)
  return optimizer, 1.0


@contextlib.contextmanager
def float32_compute(model: keras.Model) -> Iterator[None]:
  """Within the block every float16/bfloat16 layer of ``model`` computes in its variables' dtype.

  The layers, their variables and their calls are the same; only the cast of
  their inputs and weights changes. Their policies are restored afterwards.
  """

  low = [layer for layer in model._flatten_layers(include_self=True)
         if layer.dtype_policy.compute_dtype in _LOW_PRECISION]
  policies = [layer.dtype_policy for layer in low]
  try:
    for layer, policy in zip(low, policies):
      layer._set_dtype_policy(keras.mixed_precision.Policy(policy.variable_dtype))
    yield
  finally:
    for layer, policy in zip(low, policies):
      layer._set_dtype_policy(policy)
