"""sparse-dp: DP training of large embedding models that keeps gradients sparse.

    model.compile(optimizer="adam", loss="binary_crossentropy")
    private = sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", sigma1=5, sigma2=1),
                                     num_examples=N, batch_size=1024)
    model.fit(private.poisson_dataset(x, y, epochs=3), callbacks=[private.callback()])

``import sparse_dp`` registers the package's Keras objects
(``sparse_dp.layers.Embedding``, ``sparse_dp.optimizers.LazyAdam``), so
``tf.keras.models.load_model`` reads a saved private model with no
``custom_objects``. They are registered when TensorFlow is imported, not
before: ``sparse-dp privacy`` never loads TensorFlow.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

__version__ = "0.1.0"
__all__ = ["DPConfig", "PrivateTraining", "make_private"]

_KERAS_OBJECT_MODULES = ("sparse_dp.layers", "sparse_dp.optimizers")


def __getattr__(name):
  # TensorFlow loads only when training is used, not for `sparse-dp privacy`.
  if name in __all__:
    return getattr(importlib.import_module("sparse_dp.training"), name)
  raise AttributeError(f"module 'sparse_dp' has no attribute {name!r}")


def _register_keras_objects() -> None:
  for module in _KERAS_OBJECT_MODULES:
    importlib.import_module(module)


class _RegisterWhenTensorFlowLoads(importlib.abc.MetaPathFinder):
  """Finds ``tensorflow`` as usual, and registers our Keras objects once it has loaded."""

  def find_spec(self, name, path, target=None):
    if name != "tensorflow":
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
      return spec
    load = spec.loader.exec_module

    def exec_module(module):
      load(module)
      _register_keras_objects()

    spec.loader.exec_module = exec_module
    return spec


if "tensorflow" in sys.modules:
  _register_keras_objects()
elif importlib.util.find_spec("tensorflow") is not None:
  sys.meta_path.insert(0, _RegisterWhenTensorFlowLoads())
