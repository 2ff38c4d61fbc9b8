"""Every variable a model can reach, snapshotted by the separability probe to compare and restore.

A forward pass that writes something learned from the batch into a variable
(a running mean, a counter of ids seen) releases it un-noised with the
weights. Keras lists a layer's own weights, but a variable can also sit on a
``tf.Module`` attribute of a layer, in a list or dict of them, or deeper; all
of these are tracked objects, so the probe walks the whole tracked object
graph from every layer (:func:`~sparse_dp.training.checks.held_state.held_objects`:
attributes, lists, dicts, nested modules) and charges each variable to the
innermost Keras layer that holds it.

The trainable weights of the layers the DP step trains (``leaves``: Embedding
tables, Dense kernels) are left out: the step noises their updates, and
copying a large table for the probe would cost its size in memory.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, NamedTuple

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.training.checks.held_state import held_objects
from sparse_dp.training.checks.model_checks import describe_layer


class _Snapshot(NamedTuple):
  variable: tf.Variable
  holder: keras.layers.Layer  # the innermost layer that holds it
  value: tf.Tensor


class ProbeState:
  """Snapshots of the variables reachable from a model, but the DP-trained weights."""

  def __init__(self, model: keras.Model, leaves: list):
    trained = {w.ref() for leaf in leaves for w in leaf.trainable_weights}
    self._snapshots: list[_Snapshot] = []
    seen = set(trained)
    for layer in model._flatten_layers(include_self=True):
      for variable in held_variables(layer):
        if variable.ref() not in seen:
          seen.add(variable.ref())
          self._snapshots.append(_Snapshot(variable, layer, tf.identity(variable)))

  def changed(self) -> list:
    """``'variable' of layer 'name' (Type)`` for each changed variable, metrics aside."""
    return [f"'{s.variable.name}' of {describe_layer(s.holder)}" for s in self._snapshots
            if not isinstance(s.holder, keras.metrics.Metric)
            and not bool(tf.reduce_all(tf.equal(s.variable, s.value)))]

  def restore(self) -> None:
    for snapshot in self._snapshots:
      snapshot.variable.assign(snapshot.value)


def held_variables(layer: keras.layers.Layer) -> list:
  """The variables ``layer`` holds itself (:func:`.held_state.held_objects`)."""
  return held_objects(layer, lambda v: isinstance(v, tf.Variable))


@contextlib.contextmanager
def restored_state(model: keras.Model, leaves: list) -> Iterator[ProbeState]:
  """A :class:`ProbeState` of ``model``, restored when the block ends, whatever happens."""
  state = ProbeState(model, leaves)
  try:
    yield state
  finally:
    state.restore()
