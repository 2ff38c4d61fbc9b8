"""State a layer holds that may be a statistic of data: moved statistics and lookup tables.

A model is released with all it holds. Besides the weights the DP step trains
and noises, a layer can hold state of its own: ``BatchNormalization``'s moving
mean and variance, which a forward pass in training mode sets from the data
(before ``make_private``, or in a model trained without DP), or a lookup table
(``tf.lookup.StaticHashTable`` built from the ids that occur). Such state is
public only if it is still at the value its layer's configuration gives it, or
if the user declares it public; :mod:`.preprocessing_checks` refuses the rest.
The walk over what a layer holds (:func:`held_objects`) is shared with the
separability probe's snapshots (:mod:`.probe_state`).
"""

from __future__ import annotations

import inspect
from typing import Callable

import numpy as np
import tensorflow as tf

from sparse_dp._keras import keras

# Initializers whose value is a function of the layer's configuration alone.
_FIXED_INITIALIZERS = (keras.initializers.Zeros, keras.initializers.Ones,
                       keras.initializers.Constant)


def held_objects(layer, wanted: Callable[[object], bool]) -> list:
  """The objects ``wanted`` that ``layer`` holds: through attributes, lists, dicts, ``tf.Module``s.

  The walk stops at nested Keras layers (they are walked on their own) so
  that an object is charged to the innermost layer holding it.

  Args:
    layer: the layer (or ``tf.Module``) to walk.
    wanted: whether an object is one to return (a variable, a lookup table).

  Returns:
    The objects found, in the order of the walk.
  """
  found, modules, visited = [], [layer], {id(layer)}
  while modules:
    module = modules.pop()
    # tf.Module's own walk, called on the base class: a layer may define a
    # _flatten of its own (sparse_dp's Embedding flattens ids).
    for leaf in tf.Module._flatten(module, recursive=False,
                                   predicate=lambda v: wanted(v) or isinstance(v, tf.Module)):
      if wanted(leaf):
        found.append(leaf)
      elif not isinstance(leaf, keras.layers.Layer) and id(leaf) not in visited:
        visited.add(id(leaf))
        modules.append(leaf)
  return found


def moved_statistics(layer: keras.layers.Layer) -> list[str]:
  """Names of ``layer``'s non-trainable weights that are not at their initializer's value.

  A weight counts when the layer names its initializer (Keras's convention:
  ``moving_mean`` and ``moving_mean_initializer``), the initializer is fixed
  (zeros, ones, a constant) and the weight was created non-trainable: a statistic
  the layer keeps, not a parameter that was frozen. ``BatchNormalization``'s
  moving mean (zeros) and variance (ones) are such weights.

  Args:
    layer: the layer to read.

  Returns:
    The attribute names of the moved weights (``["moving_mean", "moving_variance"]``).
  """
  moved = []
  for attribute, initializer in sorted(vars(layer).items()):
    name = attribute.removesuffix("_initializer")
    if name == attribute or not isinstance(initializer, _FIXED_INITIALIZERS):
      continue
    weight = getattr(layer, name, None)
    if not isinstance(weight, tf.Variable) or weight.trainable:
      continue
    initial = initializer(shape=weight.shape, dtype=weight.dtype)
    if not np.array_equal(tf.convert_to_tensor(weight).numpy(), np.asarray(initial)):
      moved.append(name)
  return moved


def held_tables(layer: keras.layers.Layer) -> list:
  """The lookup tables ``layer`` holds, or that a ``Lambda`` layer's function refers to.

  Args:
    layer: the layer to read.

  Returns:
    Its lookup tables (``tf.lookup.StaticHashTable``, ``MutableHashTable``, ...).
  """
  tables = held_objects(layer, _is_table)
  if isinstance(layer, keras.layers.Lambda) and inspect.isfunction(layer.function):
    referred = inspect.getclosurevars(layer.function)
    for value in [*referred.nonlocals.values(), *referred.globals.values()]:
      if _is_table(value):
        tables.append(value)
      elif isinstance(value, tf.Module) and not isinstance(value, keras.layers.Layer):
        tables += held_objects(value, _is_table)
  return tables


def _is_table(obj) -> bool:
  return any(cls.__name__ == "LookupInterface" for cls in type(obj).__mro__)
