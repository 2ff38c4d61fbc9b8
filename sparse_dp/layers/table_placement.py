"""Where an :class:`~sparse_dp.layers.Embedding` layer keeps its table variable.

Under a ``TPUStrategy`` a Keras weight has one copy per core in TensorCore HBM. When the TPU
embedding engine holds a table (``embedding='tpu'``, trained by
:class:`sparse_dp.training.tpu_loop.TPUTrainer`), the engine's copy trains and the layer's
table is only the host copy that predict, save and serving read; kept in HBM it would cost
every core a full table beside the engine.
``table_placement``:

* ``"default_device"``: where the strategy puts any weight (its devices, or the parameter
  servers);
* ``"host"``: one variable in the host memory of the strategy's first worker (``CPU:0``),
  never mirrored, which no TPU program may read.

The names follow keras-rs ``TableConfig.placement``. See docs/tpu.md ("Tables off HBM").
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import tensorflow as tf
from tensorflow.python.distribute import device_util, numpy_dataset

PLACEMENTS = ("default_device", "host")


def check_placement(placement: str, layer_name: str) -> str:
  """``placement`` if it is one of :data:`PLACEMENTS`; else a ``ValueError`` naming the layer."""
  if placement not in PLACEMENTS:
    raise ValueError(f"layer '{layer_name}': table_placement must be one of "
                     f"{', '.join(PLACEMENTS)}, got {placement!r}")
  return placement


def host_device(strategy: tf.distribute.Strategy) -> str:
  """The host CPU of ``strategy``'s first worker device (``/device:CPU:0`` without a strategy)."""
  if not tf.distribute.has_strategy():
    return "/device:CPU:0"
  return device_util.get_host_for_device(strategy.extended.worker_devices[0])


@contextlib.contextmanager
def variables_placed(placement: str, layer_name: str) -> Iterator[None]:
  """The scope in which a layer creates its table for ``placement``.

  ``"host"``: a variable creator that asks the current strategy for one
  variable on :func:`host_device` (``colocate_with`` a single device, the
  argument every strategy's ``_create_variable`` takes; the one
  ``experimental_make_numpy_dataset`` uses for its host variables).
  """
  if placement == "default_device":
    yield
    return
  strategy = tf.distribute.get_strategy()
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    raise ValueError(f"layer '{layer_name}': table_placement='host' keeps a table off the TPU "
                     "cores beside the TPU embedding engine; under a ParameterServerStrategy "
                     "tables live on the parameter servers: use 'default_device'")
  device = host_device(strategy)
  if not tf.distribute.has_strategy():
    with tf.device(device):
      yield
    return

  def single_host_variable(next_creator, **kwargs):
    kwargs["colocate_with"] = numpy_dataset.SingleDevice(device)
    return next_creator(**kwargs)

  with tf.variable_creator_scope(single_host_variable):
    yield

