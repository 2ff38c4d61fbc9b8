"""Code run around the first ``import tensorflow`` of the process, without importing it before.

Each :class:`TensorFlowImportHook` finds ``tensorflow`` as usual, once, and
runs its loading through ``around``: ``around(load, module)`` must call
``load(module)``. Hooks compose: a hook installed later wraps the load of one
installed earlier.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Callable

AroundLoad = Callable[[Callable, object], None]


class TensorFlowImportHook(importlib.abc.MetaPathFinder):
  """A finder that wraps the loading of ``tensorflow`` in ``around``; see :meth:`install`."""

  def __init__(self, around: AroundLoad):
    self._around = around

  def install(self) -> None:
    sys.meta_path.insert(0, self)

  def find_spec(self, name, path, target=None):
    if name != "tensorflow":
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
      return spec
    load, around = spec.loader.exec_module, self._around
    spec.loader.exec_module = lambda module: around(load, module)
    return spec
