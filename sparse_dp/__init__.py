"""sparse-dp: DP training of large embedding models that keeps gradients sparse.

    model.compile(optimizer="adam", loss="binary_crossentropy")
    private = sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", sigma1=5, sigma2=1),
                                     num_examples=N, batch_size=1024)
    model.fit(private.poisson_dataset(x, y, epochs=3), callbacks=[private.callback()])

``import sparse_dp`` registers the package's Keras objects when TensorFlow is imported (not
before: ``sparse-dp privacy`` never loads TensorFlow), so ``keras.models.load_model`` reads a
saved private model with no ``custom_objects``. ``sparse_dp.keras`` is Keras 2 on every
supported TensorFlow; on TF 2.16+ importing the package sets ``TF_USE_LEGACY_KERAS=1`` unless
the user set it (``sparse_dp/_keras.py``). The package's parts, and the top-level ``models/``
and ``data/`` folders installed as ``sparse_dp.models`` and ``sparse_dp.data``:
docs/package_layout.md.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys

from sparse_dp._tensorflow_import import TensorFlowImportHook

__version__ = "0.1.0"
__all__ = ["DPConfig", "PrivateTraining", "make_private"]

_KERAS_OBJECT_MODULES = ("sparse_dp.layers", "sparse_dp.optimizers")


def __getattr__(name):
  # TensorFlow loads only when training is used, not for `sparse-dp privacy`.
  if name in __all__:
    return getattr(importlib.import_module("sparse_dp.training"), name)
  if name == "keras":
    return importlib.import_module("sparse_dp._keras").keras
  raise AttributeError(f"module 'sparse_dp' has no attribute {name!r}")


def _register_keras_objects() -> None:
  for module in _KERAS_OBJECT_MODULES:
    importlib.import_module(module)


def _keras_namespace_is_loading() -> bool:
  """Whether ``sparse_dp._keras`` is mid-import (it imports TensorFlow, then defines ``keras``)."""
  module = sys.modules.get("sparse_dp._keras")
  return module is not None and bool(getattr(module.__spec__, "_initializing", False))


def _register_after_loading(load, module) -> None:
  """Loads TensorFlow, then registers our Keras objects."""
  load(module)
  if _keras_namespace_is_loading():
    # Our Keras objects import ``sparse_dp._keras.keras``, not defined yet:
    # sparse_dp._keras registers them itself once it is (its last lines).
    return
  _register_keras_objects()


def _tensorflow_is_keras3() -> bool:
  """Whether the installed TensorFlow is 2.16+, whose ``tf.keras`` is Keras 3 by default.

  Read from the package metadata: importing TensorFlow here would load it for
  ``sparse-dp privacy`` too.
  """
  for distribution in ("tensorflow", "tensorflow-cpu", "tensorflow-macos"):
    try:
      version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
      continue
    major, minor = (int(part) for part in version.split(".")[:2])
    return (major, minor) >= (2, 16)
  return False


# TensorFlow 2.16+ reads this at the first use of tf.keras, and TFRS refuses
# Keras 3. TF 2.15 would switch tf.keras from `keras` 2.15 to `tf_keras` 2.15,
# away from a user's `import keras`: it is left alone there.
if _tensorflow_is_keras3():
  os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

if "tensorflow" in sys.modules:
  _register_keras_objects()
elif importlib.util.find_spec("tensorflow") is not None:
  TensorFlowImportHook(_register_after_loading).install()
