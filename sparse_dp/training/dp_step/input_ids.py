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
from sparse_dp.training.dp_step.per_example import over_examples

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


def per_example_input_ids(input_ids: InputIds, tables: list) -> InputIds:
  """``input_ids`` run on each example alone: row ``i`` of a table's ids is example ``i``'s.

  An engine's DP step reads an example's rows only from that example's row of the batch's
  lookup (:class:`~sparse_dp.layers.embedding_backends.TPUEmbeddingBackend`). Built here
  from the example's features alone, whatever ``input_ids`` does with a whole batch, that
  row never depends on another example.

  Args:
    input_ids: ``x -> {table layer name: its ids in x}``.
    tables: the model's engine tables; one example sends ``ids_per_example(table)`` ids.

  Returns:
    ``x -> {table layer name: int64 [B, k]}``, which raises ValueError when an example's ids
      of a table are not ``k`` ids, or the names are not the tables'.
  """
  widths = {table.name: ids_per_example(table) for table in tables}

  def one_example(example, position) -> dict:
    del position
    ids = {}
    for name, value in input_ids(example).items():
      if name not in widths:
        raise ValueError(f"input_ids gives ids of '{name}', which is not an embedding table "
                         f"of the model (its tables: {', '.join(widths)})")
      value = tf.reshape(tf.cast(value, tf.int64), [-1])
      if value.shape[0] != widths[name]:
        raise ValueError(
            f"input_ids gives {value.shape[0]} ids of one example for table '{name}', which "
            f"looks up {widths[name]} per example; give the ids the layer is called on")
      ids[name] = value
    absent = sorted(set(widths) - set(ids))
    if absent:
      raise ValueError(f"input_ids gives no ids of table(s) {', '.join(absent)}; it gives "
                       "each embedding table's ids by layer name")
    return ids

  signature = {name: tf.TensorSpec([k], tf.int64) for name, k in widths.items()}

  def by_example(x) -> dict:
    return over_examples(one_example, x, signature)

  by_example.per_example = True  # what an engine backend checks it is given
  return by_example
