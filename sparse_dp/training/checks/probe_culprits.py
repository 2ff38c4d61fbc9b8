"""Naming the layer (or the loss) that mixes examples, once a probe check has failed.

The same comparisons as the probe's checks, applied to each recorded layer
call on its own; the innermost failing layers are named, so that a
``Sequential`` holding a batch-centring ``Lambda`` is not blamed for it.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from sparse_dp.training.checks.model_checks import describe_layer
from sparse_dp.training.checks.probe_tensors import (
  close,
  is_batch,
  not_per_example,
  per_example,
  probe_weights,
  take,
)
from sparse_dp.training.checks.probe_trace import LayerCall, Trace
from sparse_dp.training.dp_step.losses import loss_name


def gradient_culprits(model, trace: Trace, n: int) -> list:
  """Innermost layers (or the loss) whose vector-Jacobian product is not per example.

  A call ``y = f(x)`` is per example iff its Jacobian is block-diagonal over
  examples, iff ``VJP(w * c) = w * VJP(c)`` row by row for a random
  cotangent ``c`` and random weights ``w``.
  """
  weights = probe_weights(n)
  failing = [call.layer for call in trace.layer_calls
             if _vjp_not_per_example(trace.tape, per_example(call.args, n, floating=True),
                                     per_example(call.outputs, n, floating=True), weights)]
  culprits = [describe_layer(layer) for layer in _innermost(failing)]
  if not failing and trace.predictions is not None and _vjp_not_per_example(
      trace.tape, per_example(trace.predictions, n, floating=True), [trace.losses], weights):
    culprits.append(f"the loss '{loss_name(model)}'")
  return culprits


def _vjp_not_per_example(tape, inputs: list, outputs: list, weights) -> bool:
  if not inputs or not outputs:
    return False
  rng = np.random.default_rng(1)
  cotangents = [tf.constant(rng.normal(size=o.shape), o.dtype) for o in outputs]
  plain = tape.gradient(outputs, inputs, output_gradients=cotangents)
  weighted = tape.gradient(outputs, inputs, output_gradients=[
      c * tf.reshape(tf.cast(weights, c.dtype), [-1] + [1] * (c.shape.rank - 1))
      for c in cotangents])
  return any(not_per_example(a, b, weights, None) for a, b in zip(weighted, plain))


def removal_culprits(trace: Trace, n: int) -> list:
  """Innermost layers whose output at example ``i`` changes when example ``k != i`` is removed.

  Each recorded call with per-example inputs is run again on its recorded
  inputs, with and without example ``k``; a call whose output differs
  between two runs on the same inputs is random (Dropout, GaussianNoise)
  and skipped.
  """
  failing = []
  for call in trace.layer_calls:
    if not per_example(call.args, n, floating=False):
      continue
    again = _call_again(call, list(range(n)), n)
    if again is None or not _same_outputs(again, call.outputs, n, None):
      continue
    for k in range(n):
      kept = [i for i in range(n) if i != k]
      reduced = _call_again(call, kept, n)
      if reduced is not None and not _same_outputs(reduced, call.outputs, n, kept):
        failing.append(call.layer)
        break
  return [describe_layer(layer) for layer in _innermost(failing)]


def _call_again(call: LayerCall, kept: list, n: int):
  """The layer's call on its recorded inputs restricted to examples ``kept``."""
  def restricted(value):
    return take(value, kept) if is_batch(value, n) else value
  args = tf.nest.map_structure(restricted, call.args, expand_composites=False)
  kwargs = tf.nest.map_structure(restricted, call.kwargs, expand_composites=False)
  try:
    return call.layer(*args, **kwargs)
  except (tf.errors.InvalidArgumentError, ValueError, TypeError):
    return None  # the call cannot take fewer examples: nothing to compare


def _same_outputs(new, recorded, n: int, kept: Optional[list]) -> bool:
  """``new`` equals ``recorded`` restricted to ``kept`` (all examples when ``None``).

  A recorded output whose first dimension is not the examples must come back
  identical: it may not depend on which examples are in the batch.
  """
  new, recorded = tf.nest.flatten(new), tf.nest.flatten(recorded)
  if len(new) != len(recorded):
    return False
  for a, b in zip(new, recorded):
    if kept is not None and is_batch(b, n):
      b = take(b, kept)
    a_parts = tf.nest.flatten(a, expand_composites=True)
    b_parts = tf.nest.flatten(b, expand_composites=True)
    if len(a_parts) != len(b_parts) or not all(
        x.shape == y.shape and close(x, y) for x, y in zip(a_parts, b_parts)):
      return False
  return True


def _innermost(layers: list) -> list:
  """The layers of ``layers`` that contain none of the others."""
  found = {id(layer) for layer in layers}
  inner = []
  for layer in layers:
    nested = layer._flatten_layers(include_self=False)
    if not any(id(inner_layer) in found for inner_layer in nested) and layer not in inner:
      inner.append(layer)
  return inner

