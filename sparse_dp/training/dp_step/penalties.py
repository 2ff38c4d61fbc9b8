"""Penalty terms of a DP step: weight regularizers in, data-dependent losses out.

Keras adds ``model.losses`` to the compiled loss. They are of two kinds:

* **data-independent** penalties, functions of the weights only (a ``Dense`` layer's
  ``kernel_regularizer`` / ``bias_regularizer``, ``model.add_loss(lambda: ...)``): their
  gradient is added *after* the noise, at no privacy cost (post-processing):
  ``g = (sum_i [g_i]_C2 + N(0, sigma^2 C2^2)) / B + grad R(w)``;
* **data-dependent** losses, tensors added during the forward pass (``add_loss(tensor)`` in
  ``call``, ``activity_regularizer``): not per-example and not clipped, so a DP step refuses
  them, naming the layer.

A penalty whose gradient reaches an embedding table would update every row each step;
:class:`sparse_dp.layers.Embedding` refuses ``embeddings_regularizer`` and :func:`penalty_of`
refuses such a penalty. See docs/epsilon.md ("Penalties").
"""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.layers.embedding import Embedding


class DataDependentLossError(ValueError):
  """A loss added during the forward pass, which DP training cannot clip."""

  # Raised while a step is traced: AutoGraph re-raises an error as its own type
  # only if its constructor is Exception's, else as a StagingError.
  __init__ = Exception.__init__


def _layers(model: keras.Model) -> list[keras.layers.Layer]:
  return list(model._flatten_layers(include_self=True))


def penalty_of(model: keras.Model) -> Optional[Callable[[], tf.Tensor]]:
  """The sum of ``model``'s data-independent penalties as a function, or ``None``.

  Raises if a penalty's gradient reaches an :class:`Embedding` table.
  """
  terms = [term for layer in _layers(model)
           for term in layer._callable_losses]
  if not terms:
    return None

  def penalty() -> tf.Tensor:
    values = [t for t in (term() for term in terms) if t is not None]
    return tf.add_n([tf.cast(v, tf.float32) for v in values]) if values else tf.constant(0.0)

  tables = [layer for layer in _layers(model) if isinstance(layer, Embedding) and layer.built]
  if tables:
    with tf.GradientTape() as tape:
      value = penalty()
    reached = [layer.name for layer, g in zip(
        tables, tape.gradient(value, [layer.embeddings for layer in tables])) if g is not None]
    if reached:
      raise ValueError(
          f"a penalty of the model (a regularizer or add_loss(lambda: ...)) depends on the "
          f"embedding table(s) {', '.join(reached)}: its gradient would update every row of "
          "the table at every step, which breaks the sparse DP update; remove it, or use the "
          "optimizer's decoupled weight decay (AdamW's weight_decay)")
  return penalty


def add_penalty_gradients(penalty: Optional[Callable[[], tf.Tensor]], gradients: dict) -> dict:
  """``gradients[v] + d penalty / d v`` for every variable the penalty depends on.

  ``gradients`` maps variable refs to the noisy gradients of the DP step.
  """
  if penalty is None:
    return gradients
  variables = [ref.deref() for ref in gradients]
  with tf.GradientTape(watch_accessed_variables=False) as tape:
    tape.watch(variables)
    value = penalty()
  extra = tape.gradient(value, variables)
  return {ref: (g if e is None else g + e)
          for (ref, g), e in zip(gradients.items(), extra)}


def check_no_data_dependent_losses(model: keras.Model) -> None:
  """Raises if the forward pass just run added a loss tensor (``add_loss`` in ``call``)."""
  added = [layer.name for layer in _layers(model)
           if layer._eager_losses]
  if added:
    raise DataDependentLossError(
        f"layer(s) {', '.join(added)} added a loss computed from the batch (add_loss(tensor) "
        "in call, or an activity_regularizer); DP training clips and noises per-example "
        "losses only and cannot cover it. Remove it, fold it into the per-example loss, or "
        "make it a function of the weights only (add_loss(lambda: ...) or a "
        "kernel_regularizer), which is added after the noise at no privacy cost")
