"""Per-example gradient norms and clipped sums of ``Dense`` layers (ghost clipping).

For ``z = x W + b`` with per-example input ``X_i`` (``[T, k]``: one row per
token, or ``T = 1``) and output gradient ``D_i = dL_i/dz_i`` (``[T, n]``), the
per-example gradients are ``dW_i = X_i^T D_i`` and ``db_i = sum_t D_i[t]``, so

``||dW_i||_F^2 = sum((X_i X_i^T) * (D_i D_i^T))`` (``= ||x_i||^2 ||d_i||^2`` when
``T = 1``) and the clipped sum is ``sum_i f_i X_i^T D_i``, both without ever
forming a per-example weight gradient (Goodfellow, "Efficient Per-Example Gradient
Computations", arXiv:1510.01799, 2015; Li et al., "Large Language Models Can Be Strong
Differentially Private Learners", ICLR 2022; TF Privacy's ``fast_gradient_clipping``).

During a DP step each ``Dense`` layer's ``call`` is replaced by one that
computes ``z`` itself and records ``(x, z)``; the step then differentiates the
loss with respect to ``z``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, NamedTuple

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.layers.embedding import Embedding


class UnsupportedLayerError(ValueError):
  """A layer with trainable weights whose per-example gradients cannot be clipped.

  Raised by :func:`~sparse_dp.training.make_private`. DP training supports
  ``keras.layers.Dense`` and :class:`sparse_dp.layers.Embedding`; freeze any other layer
  with ``layer.trainable = False``. Also raised for a trainable variable that no such
  layer owns, and for a ``Dense`` input of rank other than 2 or 3.
  """


class DenseCall(NamedTuple):
  layer: keras.layers.Dense
  inputs: tf.Tensor  # [B, T, k]
  preactivation: tf.Tensor  # [B, T, n]


def trainable_leaf_layers(model: keras.Model) -> list[keras.layers.Layer]:
  """Layers that own trainable weights, with a clear error for unsupported ones."""
  leaves = []
  for layer in model._flatten_layers(include_self=True):
    # A frozen layer (layer.trainable = False) has no trainable weights, whatever
    # its variables' own flags say.
    own = [w for w in layer._trainable_weights if w.trainable]
    if not own or not layer.trainable:
      continue
    if not isinstance(layer, (keras.layers.Dense, Embedding)):
      raise UnsupportedLayerError(
          f"layer '{layer.name}' ({type(layer).__name__}) has trainable weights whose "
          "per-example gradients sparse-dp cannot clip; DP training supports "
          "keras.layers.Dense and sparse_dp.layers.Embedding (replace "
          "keras.layers.Embedding by sparse_dp.layers.Embedding, or freeze the layer "
          f"with layer.trainable = False){_weightless_alternative(layer)}")
    leaves.append(layer)
  # A variable a layer holds through a tf.Module, list or dict attribute is
  # trainable for Keras but not among the layer's own weights: the DP step
  # would never train it. Every trainable variable must belong to a leaf.
  trained = {id(weight) for leaf in leaves for weight in leaf.trainable_weights}
  for variable in model.trainable_variables:
    if id(variable) not in trained:
      raise UnsupportedLayerError(
          f"trainable variable '{variable.name}' is not a weight of a keras.layers.Dense "
          "or sparse_dp.layers.Embedding layer (a layer holds it through a tf.Module, "
          "list or dict attribute), so the DP step cannot train it; make it a weight "
          "of such a layer (add_weight), or create it with trainable=False")
  return leaves


def _weightless_alternative(layer: keras.layers.Layer) -> str:
  """A form of ``layer`` without trainable weights that DP training takes, if one exists."""
  if isinstance(layer, keras.layers.LayerNormalization):
    return ("; or use LayerNormalization(center=False, scale=False), which still normalises "
            "each example by its own statistics and has no weights (a Dense after it can "
            "learn the scale and shift)")
  return ""


@contextlib.contextmanager
def recording_dense_calls(layers) -> Iterator[list[DenseCall]]:
  """Within the block, every call of a ``Dense`` in ``layers`` is recorded."""
  calls: list[DenseCall] = []
  dense = [layer for layer in layers if isinstance(layer, keras.layers.Dense)]
  graph = tf.compat.v1.get_default_graph()  # calls traced elsewhere are not the step's
  for layer in dense:
    layer.call = _recording_call(layer, calls, graph)
  try:
    yield calls
  finally:
    for layer in dense:
      del layer.call  # back to the class's method


def _recording_call(layer: keras.layers.Dense, calls: list, graph):
  def call(inputs):
    x = tf.cast(tf.convert_to_tensor(inputs), layer.compute_dtype)
    if x.shape.rank not in (2, 3):
      raise UnsupportedLayerError(
          f"layer '{layer.name}': DP training supports Dense inputs of rank 2 or 3, "
          f"got shape {x.shape}")
    tokens = x if x.shape.rank == 3 else x[:, None, :]
    z = tf.einsum("btk,kn->btn", tokens, layer.kernel)
    if layer.use_bias:
      z = z + layer.bias
    if tf.compat.v1.get_default_graph() is graph:
      calls.append(DenseCall(layer, tokens, z))
    out = z if x.shape.rank == 3 else z[:, 0, :]
    return layer.activation(out) if layer.activation is not None else out
  return call


def squared_norms(inputs: tf.Tensor, output_gradients: tf.Tensor, use_bias: bool) -> tf.Tensor:
  """``||dW_i||^2 + ||db_i||^2`` per example from ``[B, T, k]`` and ``[B, T, n]``."""
  if inputs.shape[1] == 1:
    norms = (tf.reduce_sum(tf.square(inputs), [1, 2]) *
             tf.reduce_sum(tf.square(output_gradients), [1, 2]))
  else:
    input_gram = tf.einsum("btk,bsk->bts", inputs, inputs)
    gradient_gram = tf.einsum("btn,bsn->bts", output_gradients, output_gradients)
    norms = tf.reduce_sum(input_gram * gradient_gram, [1, 2])
  if use_bias:
    norms += tf.reduce_sum(tf.square(tf.reduce_sum(output_gradients, 1)), -1)
  return norms


def clipped_sums(inputs: tf.Tensor, output_gradients: tf.Tensor, factors: tf.Tensor,
                 use_bias: bool) -> tuple[tf.Tensor, tf.Tensor | None]:
  """``(sum_i f_i dW_i, sum_i f_i db_i)``."""
  scaled = output_gradients * factors[:, None, None]
  kernel = tf.einsum("btk,btn->kn", inputs, scaled)
  return kernel, (tf.reduce_sum(scaled, [0, 1]) if use_bias else None)
