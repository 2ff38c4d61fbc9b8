"""Keras 2 on every supported TensorFlow, and a clear refusal of Keras 3 objects.

sparse_dp and TensorFlow Recommenders are written for Keras 2. Up to TF 2.15
``tf.keras`` is Keras 2. From TF 2.16 ``tf.keras`` is Keras 3, unless the
environment variable ``TF_USE_LEGACY_KERAS=1`` is set before ``tf.keras`` is
first used; Keras 2 is then the ``tf_keras`` package. The package reaches Keras
only through :data:`keras` below, so it trains Keras 2 whatever the user's
``tf.keras`` resolves to. ``import sparse_dp`` sets ``TF_USE_LEGACY_KERAS=1``
when unset (``sparse_dp/__init__.py``), so that ``tf.keras`` and TFRS are
Keras 2 too when sparse_dp is imported before ``tf.keras`` is first used.

A Keras 3 layer cannot join a Keras 2 model's layers: inside a subclassed
Keras 2 model it is tracked only as a checkpoint dependency, so its variables
train while the DP step, which clips layer by layer, never sees it.
:func:`require_keras2_model` refuses such models by the layer's path.
"""

from __future__ import annotations

import sys
from typing import Iterator

import tensorflow as tf

KERAS2_FIX = ("build it with Keras 2: `import tf_keras as keras` (or `from sparse_dp import "
              "keras`, the Keras 2 namespace on every TensorFlow), or import sparse_dp before "
              "the first use of tf.keras, which then is Keras 2 (TF_USE_LEGACY_KERAS=1)")


def _tensorflow_version() -> tuple[int, int]:
  major, minor = tf.__version__.split(".")[:2]
  return int(major), int(minor)


def _keras2_namespace():
  """``tf.keras`` up to TF 2.15; the ``tf_keras`` package from TF 2.16 on."""
  if _tensorflow_version() < (2, 16):
    _keep_keras_exports_before_tf_keras(tf.keras)
    return tf.keras
  try:
    import tf_keras
  except ImportError:
    raise ImportError(
        f"sparse_dp needs Keras 2, which TensorFlow {tf.__version__} ships separately: "
        f"pip install tf-keras=={tf.__version__}") from None
  return tf_keras


def _keep_keras_exports_before_tf_keras(keras_api) -> None:
  """Up to TF 2.15, with the ``tf_keras`` package installed beside Keras (TFRS needs it):
  imports ``tf_keras`` now, then puts back every global registration of Keras's it replaced.

  Both packages register into TensorFlow's global tables under the same keys:
  their public symbols in ``tf_export`` (``keras.layers.Dense``), which Keras
  reads to rebuild a ``.keras`` file's layers, and their SavedModel revival of
  optimizers (``"optimizer"``), whose predicate decides how an optimizer is
  saved; the package imported last wins. TensorFlow's SavedModel loader imports
  ``tf_keras`` whenever a SavedModel holds a legacy optimizer (every private
  model's LazyAdam is one). After that, ``keras.models.load_model("m.keras")``
  built ``tf_keras`` layers that never joined Keras's functional graph and
  looped forever in ``reconstruct_from_config``, and a legacy optimizer saved
  to a SavedModel could not be loaded. Imported here, with Keras's entries
  restored, the loader's import is a no-op. The tables can name one package:
  on TF 2.15 that is Keras (``tf.keras``), so ``tf_keras``'s own ``.keras``
  loading builds Keras's classes there. If ``tf_keras`` was imported before
  this module (nothing on TF 2.15 needs it), its entries stay.
  """
  if "tf_keras" in sys.modules:
    return
  from tensorflow.python.saved_model import revived_types
  from tensorflow.python.util import tf_export
  _ = keras_api.optimizers.legacy.Optimizer  # Keras's revived optimizer types are registered
  tables = (tf_export._NAME_TO_SYMBOL_MAPPING,
            revived_types._REVIVED_TYPE_REGISTRY)
  kept = [dict(table) for table in tables]
  try:
    # Imported for its registrations, which the `finally` below then overrides.
    import tf_keras.optimizers.legacy  # noqa: F401
  except ImportError:
    return
  finally:
    for table, entries in zip(tables, kept):
      table.update(entries)


keras = _keras2_namespace()

if "sparse_dp.layers" not in sys.modules:
  # This module loaded TensorFlow, so the import hook of sparse_dp/__init__.py
  # left the registration of our Keras objects to it (they need `keras`).
  import sparse_dp

  sparse_dp._register_keras_objects()


class Keras3ModelError(TypeError):
  """A Keras 3 layer or model was given where sparse_dp needs Keras 2."""


def _keras3_layer_class():
  """Keras 3's ``Layer`` if Keras 3 is loaded (any Keras 3 object imported it), else None."""
  module = sys.modules.get("keras")
  version = getattr(module, "version", None)
  if module is None or not callable(version) or not version().startswith("3."):
    return None
  return module.Layer


def _tracked_objects(root, root_name: str) -> Iterator[tuple[str, object]]:
  """``(path, object)`` for ``root`` and everything its checkpoint tracks, each once.

  The checkpoint graph holds every variable the model owns, so a layer that
  owns variables cannot hide from it (unlike ``model.layers``).
  """
  view = tf.train.TrackableView(root)
  pending, seen = [(root_name, root)], {id(root)}
  while pending:
    path, obj = pending.pop()
    yield path, obj
    for name, child in view.children(obj).items():
      if id(child) not in seen:
        seen.add(id(child))
        pending.append((f"{path}.{name}", child))


def require_keras2_model(model, name: str = "model") -> None:
  """Raises :class:`Keras3ModelError` if ``model`` is, or tracks, a Keras 3 layer.

  The error names the offending layer by its path from ``model`` and the fix.
  """
  keras3_layer = _keras3_layer_class()
  if keras3_layer is None:
    return
  if isinstance(model, keras3_layer):
    raise Keras3ModelError(
        f"{name} ({type(model).__name__}) is a Keras 3 model (tf.keras is Keras 3 on "
        f"TensorFlow {tf.__version__}); sparse_dp trains Keras 2 models: {KERAS2_FIX}")
  for path, obj in _tracked_objects(model, name):
    if isinstance(obj, keras3_layer):
      raise Keras3ModelError(
          f"{path} is a Keras 3 layer ({type(obj).__module__}.{type(obj).__name__}) inside a "
          f"Keras 2 model: its weights would train outside the DP step; {KERAS2_FIX}")
