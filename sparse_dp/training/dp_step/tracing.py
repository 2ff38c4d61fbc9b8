"""The DP step called by AutoGraph as written: unconverted, inside a caller's converted code.

A user's ``tf.function`` converts the Python it calls with AutoGraph, recursively, unless a
function is marked. The step has no tensor-dependent Python control flow, so converting it
only costs tracing time: about 16 s at the first trace in a process, for a one-table model,
and 1 s at each later one. Marked, it runs as Keras ``fit`` runs it, with AutoGraph's status
left as the caller set it, so Keras still converts a model's own ``call`` inside it
(``tf.autograph.experimental.do_not_convert`` would turn that off too); a plain-function
loss it calls runs unconverted, as under ``fit``.
"""

from __future__ import annotations

from typing import Callable, TypeVar

from tensorflow.python.autograph.impl import api as autograph_api

Function = TypeVar("Function", bound=Callable)


def traced_as_written(function: Function) -> Function:
  """Marks ``function`` so that AutoGraph calls it unconverted, keeping the caller's status.

  Args:
    function: a function that runs the same converted or not.

  Returns:
    ``function`` itself, marked as AutoGraph marks its own artifacts.
  """
  return autograph_api.autograph_artifact(function)
