"""A private model's optimizer applies the DP step's updates and no others.

``epsilon()`` accounts the DP steps. A custom loop that applies its own
gradients through the private model's optimizer (``tf.GradientTape`` then
``model.optimizer.apply_gradients``, or ``optimizer.minimize``) would move the
weights without clipping or noise while the accountant counts nothing.
:func:`guard` makes the optimizer refuse every ``apply_gradients`` made
outside :func:`dp_step_update`, the scope the DP step
(:mod:`sparse_dp.training.wrappers.dp_train_step`) opens around its own update. The
check runs in Python, when a step is traced or run eagerly, so it holds in
``tf.function`` and under XLA alike.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Iterator

import tensorflow as tf

_scope = threading.local()


class UpdateOutsideDPStepError(RuntimeError):
  """A private model's optimizer was asked to apply gradients the DP step did not make.

  Raised by ``optimizer.apply_gradients`` (or ``minimize``) called outside the DP step,
  e.g. in a ``tf.GradientTape`` loop: that update would be neither clipped, noised nor
  accounted. Train with ``model.fit`` or ``train_on_batch``, or call
  ``model.train_step(batch)`` in the loop.
  """

  # Raised while a loop is traced: AutoGraph re-raises an error as its own type
  # only if its constructor is Exception's.
  __init__ = Exception.__init__


@contextlib.contextmanager
def dp_step_update() -> Iterator[None]:
  """Within the block the guarded optimizers apply gradients (the DP step's update)."""
  _scope.depth = getattr(_scope, "depth", 0) + 1
  try:
    yield
  finally:
    _scope.depth -= 1


def guard(optimizer, model_name: str):
  """Makes ``optimizer.apply_gradients`` refuse calls outside :func:`dp_step_update`."""
  if getattr(optimizer, "_sparse_dp_guarded", False):
    return optimizer
  apply_gradients = optimizer.apply_gradients

  @functools.wraps(apply_gradients)
  def guarded(*args, **kwargs):
    if not getattr(_scope, "depth", 0):
      raise UpdateOutsideDPStepError(
          f"sparse-dp: the optimizer of private model '{model_name}' applies only the DP "
          "step's updates (clipped, noised and accounted); gradients applied outside it (a "
          "tf.GradientTape loop calling optimizer.apply_gradients or minimize) would train "
          "without DP while epsilon() counts none of it. Train with model.fit or "
          "train_on_batch, or call model.train_step(batch) in your loop: that is the DP step")
    return apply_gradients(*args, **kwargs)

  optimizer.apply_gradients = guarded
  optimizer._sparse_dp_guarded = True
  return optimizer


def withheld(gradients: dict, allowed: tf.Tensor, every_row: bool) -> dict:
  """The step's gradients where ``allowed``, else an update that uses no data.

  A refused step (past the budget, or a batch larger than the declared rate allows) still
  runs when the compiled step is called directly, where XLA drops its asserts: its values
  become zeros and the rows of a row-sparse gradient (the selection's, chosen from the batch)
  row 0. A lazy optimizer then moves nothing; any other moves as its state alone says, the
  same whatever the data.

  Args:
    gradients: the step's gradients by variable ref (tensors or ``tf.IndexedSlices``).
    allowed: a boolean scalar tensor.
    every_row: whether a table's ``tf.IndexedSlices`` holds every row (dense noise, DP-SGD
      and DP-FEST: its rows are the same whatever the data) rather than selected ones.

  Returns:
    The gradients to apply.
  """
  as_dtype = {}  # ``allowed`` as 0/1 of each dtype, cast once

  def factor(dtype):
    if dtype not in as_dtype:
      as_dtype[dtype] = tf.cast(allowed, dtype)
    return as_dtype[dtype]

  def gate(gradient):
    if not isinstance(gradient, tf.IndexedSlices):
      return gradient * factor(gradient.dtype)
    values = gradient.values * factor(gradient.values.dtype)
    indices = (gradient.indices if every_row
               else gradient.indices * factor(gradient.indices.dtype))
    return tf.IndexedSlices(values, indices, gradient.dense_shape)

  return {key: gate(gradient) for key, gradient in gradients.items()}
