"""Recording of embedding lookups during a DP training step.

A DP step needs, per table, which example looked up which row and the tensor
of looked-up vectors, so that it can take the loss gradient with respect to
those vectors (the per-example row gradients, Ghazi et al., NeurIPS 2023, §2.1). Embedding
layers report each lookup to the innermost active :func:`recording` scope;
outside one they report nothing and cost nothing. Recording happens when the
step is traced, so it works inside ``tf.function``.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, NamedTuple, Optional

import tensorflow as tf

from sparse_dp._keras import keras


class Lookup(NamedTuple):
  """Example ``example[i]`` looked up row ``row[i]`` of ``layer``'s table as ``vectors[i]``."""

  layer: keras.layers.Layer
  example: tf.Tensor  # int64 [n]
  row: tf.Tensor  # int64 [n]
  vectors: tf.Tensor  # [n, d], the gathered rows, on the gradient tape
  batch_size: tf.Tensor  # int64 scalar
  outside: Optional[tf.Tensor] = None  # bool [n]: id outside the vocabulary (under XLA), or
  # one an embedding engine's step cannot read for this example


class Recorder:
  """Collects the lookups made while it is active, in the graph it was opened in.

  Calls traced in another graph (Keras builds a lazily-built ``Sequential``
  by calling its layers in a scratch graph) are not part of the step and are
  ignored. ``example``: the position in the step's batch of the one example whose forward
  pass it records (an int64 scalar), or ``None`` for a pass over a whole batch.
  """

  def __init__(self, tape: Optional[tf.GradientTape] = None,
               example: Optional[tf.Tensor] = None):
    self.lookups: list[Lookup] = []
    self.graph = tf.compat.v1.get_default_graph()
    self.tape = tape
    self.example = example

  def is_current(self) -> bool:
    return tf.compat.v1.get_default_graph() is self.graph

  def by_layer(self) -> dict[keras.layers.Layer, list[Lookup]]:
    """Lookups grouped by table (a layer called on several features has several)."""
    groups: dict = {}
    for lookup in self.lookups:
      groups.setdefault(lookup.layer, []).append(lookup)
    return groups


_state = threading.local()


@contextlib.contextmanager
def recording(tape: Optional[tf.GradientTape] = None,
              example: Optional[tf.Tensor] = None) -> Iterator[Recorder]:
  """Activates a :class:`Recorder` for the lookups made inside the block.

  With ``tape``, each recorded lookup's vectors are watched by it, so the
  loss's gradient with respect to them exists whatever the lookup read: a
  table variable, or rows an embedding engine returned outside the tape.
  ``example``: the batch position of the one example the block runs on
  (:func:`recorded_example`).
  """
  stack = _state.__dict__.setdefault("stack", [])
  recorder = Recorder(tape, example)
  stack.append(recorder)
  try:
    yield recorder
  finally:
    stack.pop()


def is_recording() -> bool:
  """Whether a :func:`recording` scope is open in the graph being built."""
  stack = getattr(_state, "stack", None)
  return bool(stack) and stack[-1].is_current()


def recorded_example() -> Optional[tf.Tensor]:
  """The batch position of the one example whose forward pass is being recorded.

  ``None`` outside a :func:`recording` scope of one example (a function traced inside the
  scope, such as a ``tf.cond`` branch, is inside it): an embedding engine's step
  reads an example's rows from that example's own part of the batch's lookup
  (:class:`~sparse_dp.layers.embedding_backends.TPUEmbeddingBackend`).
  """
  stack = getattr(_state, "stack", None)
  if not stack:
    return None
  # The scope's graph, or a function traced inside it (a tf.cond branch, a loop body).
  graph = tf.compat.v1.get_default_graph()
  while graph is not None:
    if graph is stack[-1].graph:
      return stack[-1].example
    graph = getattr(graph, "outer_graph", None)
  return None


def record_lookup(lookup: Lookup) -> None:
  """Called by embedding layers; a no-op outside :func:`recording`."""
  stack = getattr(_state, "stack", None)
  if stack and stack[-1].is_current():
    stack[-1].lookups.append(lookup)
    if stack[-1].tape is not None:
      stack[-1].tape.watch(lookup.vectors)
