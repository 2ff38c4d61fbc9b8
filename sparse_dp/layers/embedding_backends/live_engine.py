"""The embedding engine's two operations on the live TPU embedding API.

:class:`LiveEngine` gives :class:`~sparse_dp.layers.embedding_backends.tpu.TPUEmbeddingBackend`
the interface of :class:`~sparse_dp.layers.embedding_backends.doubles.engine_double.EngineDouble`
(``lookup``, ``apply_gradients``, ``slots``, ``build``) on
``tf.tpu.experimental.embedding.TPUEmbedding``: ``lookup`` is an inference round
(``enqueue(ids, training=False)``, ``dequeue()``), ``apply_gradients`` a training round
(``enqueue(ids, training=True)``, ``dequeue()``, ``apply_gradients``). It computes no DP
quantity. Features a call does not name go as the dummy row with zero gradients, ids are
padded to static bounds, and the activations pass through a zero ``anchor`` so that the DP
step's tape records them. :meth:`enqueue_round`, :meth:`dequeue_round` and
:meth:`send_gradients` are the calls of :class:`sparse_dp.training.tpu_loop.TPUTrainer`, which
``fit`` cannot make (one round per TPU program). Never run on a TPU: tested through
:class:`~sparse_dp.layers.embedding_backends.doubles.tpu_api_double.TPUEmbeddingAPIDouble`.
See docs/tpu.md ("The live engine").
"""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

_API = tf.tpu.experimental.embedding


class StaticFeatureEngine:
  """An engine on a mid-level API object whose features each take a static number of ids.

  ``feature_config``: a flat ``{name: FeatureConfig}`` dict of univalent
  features; ``input_bounds[name]``: the static number of ids the feature takes
  per round (per replica); ``api_factory(feature_config, optimizer)`` makes the
  API object. A round gives every feature (the ones a call does not name as
  the table's dummy row, its last row) padded to its bound; activations it
  returns pass through ``+ anchor`` (the class docstring of :class:`LiveEngine`).
  """

  def __init__(self, feature_config: dict, optimizer, input_bounds: dict,
               api_factory: Callable):
    missing = sorted(set(feature_config) - set(input_bounds))
    if missing:
      raise ValueError(f"{type(self).__name__}: no static input bound for features "
                       f"{missing}; give input_bounds={{feature: most ids per round}}")
    self.feature_config = dict(feature_config)
    self.input_bounds = {name: int(input_bounds[name]) for name in feature_config}
    self.api = api_factory(self.feature_config, optimizer)
    with tf.init_scope():
      self._anchor = tf.Variable(0.0, trainable=True, name="activation_anchor")

  @property
  def checkpointable(self):
    """The API object (a checkpoint save retrieves its tables and slots from the TPU)."""
    return getattr(self.api, "checkpointable", self.api)

  def slots(self, table_name: str) -> dict:
    """``{"parameters": table, slot: variable}`` as the API object holds them on the host.

    On a TPU these are current only after a retrieval (a checkpoint save).
    """
    return self.api._variables[table_name]

  def _dummy(self, name: str) -> int:
    return self.feature_config[name].table.vocabulary_size - 1

  def _padded_ids(self, features: dict) -> dict:
    """Every feature's ids, padded to its bound with its table's dummy row."""
    padded = {}
    for name, bound in self.input_bounds.items():
      ids = tf.reshape(tf.cast(features.get(name, tf.zeros([0], tf.int32)), tf.int32), [-1])
      count = tf.size(ids)
      # The message only: how many ids the batch has is an un-noised statistic of it.
      too_many = f"sparse-dp: feature {name} has more ids than its static TPU bound {bound}"
      if ids.shape[0] is not None and ids.shape[0] > bound:  # static: refused as it is traced
        raise ValueError(too_many)
      fits = tf.debugging.Assert(count <= bound, [too_many])
      with tf.control_dependencies([fits]):
        padding = tf.fill([bound - count], self._dummy(name))
      padded[name] = tf.ensure_shape(tf.concat([ids, padding], 0), [bound])
    return padded

  def _padded_gradients(self, gradients: dict) -> dict:
    """Every feature's activation gradients, padded with zeros to ``[bound, dim]``."""
    padded = {}
    for name, bound in self.input_bounds.items():
      width = self.feature_config[name].table.dim
      given = tf.reshape(gradients.get(name, tf.zeros([0, width])), [-1, width])
      padding = tf.zeros(tf.stack([bound - tf.shape(given)[0], width]), given.dtype)
      padded[name] = tf.ensure_shape(tf.concat([given, padding], 0), [bound, width])
    return padded


class LiveEngine(StaticFeatureEngine):
  """Inference and training rounds of a mid-level ``TPUEmbedding`` object.

  It gives :class:`~sparse_dp.layers.embedding_backends.tpu.TPUEmbeddingBackend` the interface
  of :class:`~sparse_dp.layers.embedding_backends.doubles.engine_double.EngineDouble`:
  ``lookup``, ``apply_gradients``, ``slots`` and ``build``.
  A lookup is an inference round, ``enqueue(ids, training=False)`` then ``dequeue()``.
  A training round is ``enqueue(ids, training=True)``, ``dequeue()``, then ``apply_gradients``.
  Each round gives every feature, padded to its static bound.
  The features a call does not name go as the table's dummy row (its last row), with zero
  gradients.
  The activations pass through a zero ``anchor`` so that the DP step's tape records them.
  It computes no DP quantity.

  Args:
    feature_config: a flat ``{name: FeatureConfig}`` dict of univalent features.
    optimizer (Any): the engine optimizer, of ``tf.tpu.experimental.embedding``.
    input_bounds: ``input_bounds[name]``, the static number of ids feature ``name`` takes per
      round (per replica).
    api_factory: ``api_factory(feature_config, optimizer)`` makes the API object. The default
      is ``tf.tpu.experimental.embedding.TPUEmbedding``; create the engine under the
      ``TPUStrategy``'s scope.

  Attributes:
    api: the API object.

  Raises:
    ValueError: a feature of ``feature_config`` without a bound in ``input_bounds``.
  """

  def __init__(self, feature_config: dict, optimizer, input_bounds: dict,
               api_factory: Optional[Callable] = None):
    super().__init__(feature_config, optimizer, input_bounds,
                     api_factory or _API.TPUEmbedding)

  @property
  def backend_name(self) -> str:
    """``"tpu"`` on the real API object, ``"tpu-api-double"`` on its double."""
    return "tpu" if isinstance(self.api, _API.TPUEmbedding) else "tpu-api-double"

  def build(self) -> None:
    """Builds the API object with every feature's static per-replica shape ``[bound]``."""
    self.api.build({name: tf.TensorShape([bound]) for name, bound in self.input_bounds.items()})

  def enqueue_round(self, features: dict, training: bool, device: Optional[str] = None):
    """``enqueue`` of ``features`` (the others as the dummy row), padded to the bounds.

    Args:
      features: ``{feature name: ids}``.
      training: whether the round is a training round.
      device: the device the enqueue is placed on, as the API's ``enqueue`` takes it.
    """
    self.api.enqueue(self._padded_ids(features), training=training, device=device)

  def dequeue_round(self, counts: dict) -> dict:
    """``dequeue``: the first ``counts[name]`` activations of each named feature, on the tape.

    Args:
      counts: ``{feature name: number of activations}``.

    Returns:
      ``{feature name: activations}``.
    """
    activations = self.api.dequeue()
    return {name: activations[name][:count] + self._anchor for name, count in counts.items()}

  def send_gradients(self, gradients: dict) -> None:
    """``apply_gradients``: each feature's gradients padded with zeros to ``[bound, dim]``.

    Args:
      gradients: ``{feature name: activation gradients}``.
    """
    self.api.apply_gradients(self._padded_gradients(gradients))

  def lookup(self, features: dict) -> dict:
    """An inference round: the rows of each named feature's ids (changes nothing).

    Args:
      features: ``{feature name: ids}``.

    Returns:
      ``{feature name: activations}``, one row per id.
    """
    self.enqueue_round(features, training=False)
    return self.dequeue_round({name: tf.size(ids) for name, ids in features.items()})

  def apply_gradients(self, features: dict, gradients: dict) -> tf.Operation:
    """A training round: ``features`` ids with their activation ``gradients``.

    The API's ``apply_gradients`` returns nothing.
    Inside ``tf.function`` its send is ordered before later reads by automatic control
    dependencies.

    Args:
      features: ``{feature name: ids}``.
      gradients: ``{feature name: activation gradients}``.

    Returns:
      A no-op.
    """
    self.enqueue_round(features, training=True)
    self.api.dequeue()  # the round's activations: the DP update does not use them
    self.send_gradients(gradients)
    return tf.no_op()
