"""Mixed precision in DP training: 16-bit compute, a float32 mechanism, a fixed loss scale.

Under a Keras mixed policy (``mixed_bfloat16``, the TPU default, or
``mixed_float16``) the variables are float32 and the layers compute in 16 bits.
The DP step (:mod:`sparse_dp.training.dp_step.step`) runs each example's forward and
backward pass in the layers' precision, and casts what leaves that per-example
program to float32 (:mod:`sparse_dp.training.dp_step.per_example`): ``l_i``, the
gradients ``dl_i/d(looked-up vector)`` and ``dl_i/dz`` and the ``Dense``
inputs. The norms ``||g_i||``, the contribution map, the clipping to ``C2``,
the selection and the noise ``N(0, sigma^2 C2^2)`` are then float32, as in a
float32 model, and the update reaches the float32 variables. Rounding in 16
bits changes *which* ``g_i`` an example has, never the bound
``||[g_i]_C2|| <= C2`` nor the noise: the mechanism, hence the epsilon, is the
float32 one (same accountant events).

**Loss scaling** (``mixed_float16``: float16 gradients below ``6e-8``
underflow to zero). Each example's loss is multiplied by a scale ``S`` before
its backward pass and its gradients are divided by ``S`` in float32, before
the norms: clipping ``S g_i`` instead would clip ``g_i`` to ``C2 / S``. A
gradient that overflows float16 (``inf``) makes that example's gradient
non-finite, and the step zeroes it before clipping as it zeroes any
non-finite example (:func:`sparse_dp.training.dp_step.step._clipped_sums`): the
update is the one without that example.

``S`` must be **fixed**: Keras's dynamic loss scale halves ``S`` when the
un-noised gradients of a step overflow and doubles it after a run of finite
steps. That is state computed from the private batch without noise: it
shapes every later step (which examples overflow, hence are zeroed) and is
saved with the optimizer, outside the epsilon. Fed the DP step's noisy
gradients instead (always finite) it would only ever grow, until every
example overflows and is zeroed. So the DP step takes the scale of a
``LossScaleOptimizer(inner, dynamic=False, initial_scale=S)`` and applies
the updates with ``inner``; a dynamic one is refused. A per-example loss is
not divided by the batch size ``B``, so its gradients are ``B`` times a mean
loss's: the scale that kept a mean loss from underflowing, divided by ``B``,
does the same here.

**The separability probe** (:mod:`sparse_dp.training.checks.separability`) compares
losses and gradients to a relative ``1e-4``; float16 rounds at ``1e-3`` and
bfloat16 at ``8e-3``, which made it see examples mix where none did, and a
tolerance that wide would lose power against a batch mean over its 13
examples (an effect of ~1/13 of a difference). Coupling
does not depend on the precision: the probe runs the same layers in float32
(:func:`float32_compute`), with its float32 tolerance and power.
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
