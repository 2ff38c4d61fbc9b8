"""Which ids each embedding table of a model looks up in a batch.

A TPU embedding engine looks a batch's ids up once per step, before the
model's forward passes (V1: :class:`~sparse_dp.training.tpu_loop.TPUTrainer`'s
inference round; V2: :class:`~sparse_dp.layers.embedding_backends.SparseCoreBackend`'s
lookup at the start of the step): it needs each table's ids in the batch's
features and a static bound on how many there are.
"""

from __future__ import annotations

import math
from typing import Callable

import tensorflow as tf

from sparse_dp._keras import keras

InputIds = Callable[[object], dict]  # x -> {embedding layer name: its ids in the batch}


def ids_per_example(layer) -> int:
  """The static number of ids one example sends ``layer`` (its input shape past the batch)."""
  shape = tf.TensorShape(getattr(layer, "_build_input_shape", None))
  if shape.rank is None or not shape[1:].is_fully_defined():
    raise ValueError(f"embedding layer {layer.name} has no static number of ids per example "
                     f"(input shape {shape}); the TPU embedding engine needs a static bound")
  return math.prod(shape[1:])


def functional_input_ids(model: keras.Model, tables: list) -> InputIds:
  """``input_ids`` of a functional model whose every table is called once on a model input."""
  positions = {}
  for layer in tables:
    nodes = getattr(layer, "inbound_nodes", [])
    inputs = [t for node in nodes for t in tf.nest.flatten(node.input_tensors)]
    found = [i for i, t in enumerate(getattr(model, "inputs", None) or []) if
             any(t is s for s in inputs)]
    if len(nodes) != 1 or len(found) != 1:
      raise ValueError(
          f"embedding layer {layer.name} is not called once directly on a model input, so "
          "the TPU embedding engine cannot find its ids in a batch; pass "
          "input_ids=lambda x: {layer name: that layer's ids in x}")
    positions[layer.name] = found[0]
  names = model.input_names

  def input_ids(x) -> dict:
    if isinstance(x, dict):
      return {layer: x[names[i]] for layer, i in positions.items()}
    flat = tf.nest.flatten(x)
    return {layer: flat[i] for layer, i in positions.items()}

  return input_ids
