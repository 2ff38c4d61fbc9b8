"""The embedding engine's two operations on the live TPU embedding API.

:class:`LiveEngine` gives :class:`~sparse_dp.layers.embedding_backends.tpu.TPUEmbeddingBackend`
the interface of :class:`~sparse_dp.layers.embedding_backends.doubles.engine_double.EngineDouble`
(``lookup``, ``apply_gradients``, ``slots``, ``build``) on the mid-level API
object ``tf.tpu.experimental.embedding.TPUEmbedding``
(``tensorflow/python/tpu/tpu_embedding_v2.py``, the same file in TF 2.15 and 2.21):

* ``lookup(features)`` is an **inference round**: ``enqueue(ids, training=False)``
  then ``dequeue()``; it changes no row or slot;
* ``apply_gradients(features, gradients)`` is a **training round**:
  ``enqueue(ids, training=True)``, ``dequeue()`` (its activations are not used),
  ``apply_gradients(activation gradients)``.

It only moves ids and gradients the DP step already made
(:mod:`sparse_dp.mechanisms`); it computes no DP quantity. How it meets the
API's rules (each named by the function of ``tpu_embedding_v2.py`` that checks it):

* an enqueue gives every feature (``enqueue``: ``nest.assert_same_structure``)
  and ``apply_gradients`` one gradient per feature: features a call does not
  name are sent as the table's dummy row (its last row, which
  ``TPUEmbeddingBackend`` reserves) with zero gradients;
* each feature has one static shape in every round (``build``:
  ``_check_output_shapes_fully_defined``; ``enqueue``: ``_check_output_shapes``):
  ids are padded to the feature's static bound with the dummy row, the
  activations sliced back, the gradients padded with zeros to
  ``[bound, dim]``, the shape ``apply_gradients`` checks;
* the dequeued activations are no gather of a variable a gradient tape
  watches (``dequeue``: ``recv_tpu_embedding_activations``): the API's own
  example calls ``tape.watch(activations)``. The DP step's tape is opened by
  :func:`sparse_dp.training.dp_step.step.private_gradients`, out of the backend's
  reach, so the activations pass through ``+ anchor``, a trainable scalar
  fixed at ``0.0`` that the tape watches when read: the sum is the
  activations bit for bit (``x + 0.0 = x``) and is recorded on the tape, so the
  step's ``dL/d(looked-up vectors)`` is taken as with the CPU backend.

**Why ``fit`` on a ``TPUStrategy`` cannot use it** (so a model made private
with ``embedding='tpu'`` refuses ``fit``, naming ``TPUTrainer``). Keras runs
one DP step as one TPU program (``strategy.run(train_step)``), and the API
allows neither round where that program needs it:

1. *one round per TPU program.* "There can be at most one
   RecvTPUEmbeddingActivations op in the TPU graph" (op doc,
   ``tensorflow/python/ops/gen_tpu_ops.py``, ``recv_tpu_embedding_activations``),
   and the TF-XLA bridge fails a function holding two of them, or two
   ``SendTPUEmbeddingGradients``, with "should be unique within a function"
   (``tensorflow/compiler/mlir/tensorflow/transforms/rewrite_tpu_embedding_ops.cc``,
   ``GetOp``). On a TPU a DP-AdaFEST step needs an inference round (the
   forward pass reads the engine's rows: the host tables are stale, point 4)
   and a training round whose ids, the selected rows, exist only after it.
   (Off TPU, ``fit`` with this adapter reads the layer's table, kept equal to
   the engine's rows, and runs the training round only.)
2. *enqueue inside ``strategy.run`` takes only its direct arguments*
   (``_raise_error_for_non_direct_inputs``): the selected rows are computed on
   the TensorCore, and a layer's ids are flattened and checked by the layer.
3. *one enqueue gives every feature*, while a Keras model calls its tables one
   after another in the forward pass.
4. *the host tables are stale on a TPU* (``embedding_tables`` raises;
   ``_retrieve_variables`` runs at checkpoint saves), while the backend copies
   the step's rows into the Keras layer after each step for predict and save.

A custom loop meets all four with two programs per step: the host enqueues the
batch's ids (``training=False``) and ``strategy.run`` runs the DP step (dequeue,
forward, mechanisms, dense update) returning the selected rows and their noisy
rows; the host enqueues those rows (``training=True``, ``device=`` each TPU
core) and a second ``strategy.run`` dequeues and applies the gradients.
:meth:`enqueue_round`, :meth:`dequeue_round` and :meth:`send_gradients` are
those calls, one API call each; :class:`sparse_dp.training.tpu_loop.TPUTrainer`
is that loop. None of this has run on a TPU: it is tested through
:class:`~sparse_dp.layers.embedding_backends.doubles.tpu_api_double.TPUEmbeddingAPIDouble`.

``TPUEmbeddingV2`` (SparseCore, TF 2.16+, ``tpu_embedding_v3.py``) has no
training flag: ``apply_gradients(gradients, preserved_outputs)`` takes the
``preserved_outputs`` of the same batch's ``embedding_lookup``;
:mod:`.sparsecore` adapts it on :class:`StaticFeatureEngine`.
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
      fits = tf.debugging.assert_less_equal(count, bound, message=(
          f"sparse-dp: feature {name} has more ids than its static TPU bound {bound}"))
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

  ``feature_config``, ``input_bounds``: as :class:`StaticFeatureEngine`.
  ``api_factory(feature_config, optimizer)`` makes the API object (default
  ``tf.tpu.experimental.embedding.TPUEmbedding``; create the engine under the
  ``TPUStrategy``'s scope).
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
    """``enqueue`` of ``features`` (the others as the dummy row), padded to the bounds."""
    self.api.enqueue(self._padded_ids(features), training=training, device=device)

  def dequeue_round(self, counts: dict) -> dict:
    """``dequeue``: the first ``counts[name]`` activations of each named feature, on the tape."""
    activations = self.api.dequeue()
    return {name: activations[name][:count] + self._anchor for name, count in counts.items()}

  def send_gradients(self, gradients: dict) -> None:
    """``apply_gradients``: each feature's gradients padded with zeros to ``[bound, dim]``."""
    self.api.apply_gradients(self._padded_gradients(gradients))

  def lookup(self, features: dict) -> dict:
    """An inference round: the rows of each named feature's ids (changes nothing)."""
    self.enqueue_round(features, training=False)
    return self.dequeue_round({name: tf.size(ids) for name, ids in features.items()})

  def apply_gradients(self, features: dict, gradients: dict) -> tf.Operation:
    """A training round: ``features`` ids with ``gradients`` (their activation gradients).

    The API's ``apply_gradients`` returns nothing; inside ``tf.function`` its
    send is ordered before later reads by automatic control dependencies.
    """
    self.enqueue_round(features, training=True)
    self.api.dequeue()  # the round's activations: the DP update does not use them
    self.send_gradients(gradients)
    return tf.no_op()
