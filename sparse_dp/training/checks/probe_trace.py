"""The separability probe's record of one training-mode forward pass.

One pass of the DP step's own loss function on the probe's examples, on a
persistent gradient tape, recording what the step clips with (embedding
lookups, Dense calls), the float input features, and every layer call (to
name the layer that mixes examples when a check fails).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator, NamedTuple, Optional

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.layers.recording import recording
from sparse_dp.training.checks.probe_tensors import flatten_with_paths, rows
from sparse_dp.training.dp_step import dense_layers

LossesOf = Callable[[object], tuple]  # batch -> (per-example losses [B], y, y_pred)


class PerExample(NamedTuple):
  """A tensor whose row ``r`` belongs to example ``example[r]`` (to example ``r`` if ``None``)."""

  description: str
  tensor: tf.Tensor
  example: Optional[tf.Tensor] = None


@dataclasses.dataclass
class LayerCall:
  layer: keras.layers.Layer
  args: tuple
  kwargs: dict
  outputs: object


@dataclasses.dataclass
class Trace:
  """One recorded training-mode forward pass of the probe, on a persistent tape."""

  tape: tf.GradientTape
  losses: tf.Tensor  # [n]
  predictions: Optional[tf.Tensor]
  inputs: list  # PerExample: the float input features
  lookups: list  # recording.Lookup
  dense_calls: list  # dense_layers.DenseCall
  layer_calls: list  # LayerCall


def trace(model: keras.Model, leaves: list, losses_of: LossesOf, probe, n: int) -> Trace:
  """Runs ``losses_of(probe)`` once, recording it (``n``: the examples of ``probe``)."""
  inputs = [PerExample(f"input feature {path}", t) for path, t in flatten_with_paths(probe)
            if isinstance(t, tf.Tensor) and t.dtype.is_floating and rows(t) == n]
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([i.tensor for i in inputs])
    with recording() as lookups, dense_layers.recording_dense_calls(leaves) as dense_calls:
      with _recording_layer_calls(_probed_layers(model)) as layer_calls:
        losses, _, predictions = losses_of(probe)
  return Trace(tape, tf.convert_to_tensor(losses), predictions, inputs, lookups.lookups,
               dense_calls, layer_calls)


def _probed_layers(model) -> list:
  """Every layer of ``model`` (itself included) that computes on the batch: not metrics."""
  return [layer for layer in model._flatten_layers(include_self=True)
          if not isinstance(layer, keras.metrics.Metric)]


@contextlib.contextmanager
def _recording_layer_calls(layers) -> Iterator[list]:
  """Within the block, every call of a layer in ``layers`` is recorded as a :class:`LayerCall`.

  Wraps whatever ``call`` the layer has now (the DP step's Dense recorder
  included) and puts it back afterwards.
  """
  calls: list = []
  saved = {}
  graph = tf.compat.v1.get_default_graph()  # calls traced elsewhere are not the probe's
  for layer in layers:
    saved[layer] = layer.__dict__.get("call")
    layer.call = _recorded(layer, layer.call, calls, graph)
  try:
    yield calls
  finally:
    for layer, own in saved.items():
      if own is None:
        del layer.call
      else:
        layer.call = own


def _recorded(layer, call, calls: list, graph):
  def recorded_call(*args, **kwargs):
    outputs = call(*args, **kwargs)
    if tf.compat.v1.get_default_graph() is graph:
      calls.append(LayerCall(layer, args, kwargs, outputs))
    return outputs
  return recorded_call
