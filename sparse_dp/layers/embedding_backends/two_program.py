"""The TPU embedding backend of a DP step split into two TPU programs.

The API allows one round per TPU program, while a DP-AdaFEST step needs an inference round
for its forward pass and then a training round on the rows it selected.
:class:`TwoProgramBackend` splits the step there, and
:class:`sparse_dp.training.tpu_loop.TPUTrainer` runs the programs: **program A** runs the
model's DP ``train_step`` inside :meth:`TwoProgramBackend.inference_round` (its lookups read
the round the host enqueued) and holds the table update in ``pending`` (the training round's
ids and activation gradients, which it returns) together with the step's engine learning
rate; **program B** (:meth:`TwoProgramBackend.training_update`) dequeues the training round
the host enqueued with those ids and sends the gradients. See docs/tpu.md ("The two-program
loop").
"""

from __future__ import annotations

import contextlib
import functools
from typing import Callable, Optional

import tensorflow as tf

from sparse_dp.layers.embedding_backends.live_engine import LiveEngine
from sparse_dp.layers.embedding_backends.tpu import (
  TPUEmbeddingBackend,
  example_round,
  feature_bounds,
  step_learning_rate,
)


class TwoProgramBackend(TPUEmbeddingBackend):
  """Tables in a :class:`LiveEngine`, updated by a program after the DP step's program.

  The API allows one round per TPU program.
  A DP-AdaFEST step needs an inference round for its forward pass, then a training round on
  the rows it selected.
  :class:`sparse_dp.training.tpu_loop.TPUTrainer` runs the two programs.
  Program A runs the model's DP ``train_step`` inside :meth:`inference_round`.
  It holds the table update in :attr:`pending`, with the step's engine learning rate.
  Program B (:meth:`training_update`) dequeues the training round the host enqueued with those
  ids, and sends the gradients.
  Create it under the strategy's scope.

  Args:
    tables: the model's :class:`~sparse_dp.layers.Embedding` layers.
    optimizer (keras.optimizers.Optimizer): the model's sparse Keras optimizer (see
      :class:`~.tpu.TPUEmbeddingBackend`).
    update_bounds: ``update_bounds[layer]``, the static length of the layer's update feature.
    input_bounds: ``input_bounds[layer]``, the most ids the layer looks up per step (its
      model feature's static length).
    api_factory: makes the API object. The default is the real ``TPUEmbedding``; off TPU,
      :class:`~.doubles.tpu_api_double.TPUEmbeddingAPIDouble`.
    sum_inside_sqrt: as :class:`~.tpu.TPUEmbeddingBackend`'s.

  Raises:
    ValueError: a refusal of :class:`~.tpu.TPUEmbeddingBackend`.
  """

  reads_engine_in_step = True  # the round inference_round dequeues

  def __init__(self, tables: list, optimizer, update_bounds: dict, input_bounds: dict,
               api_factory: Optional[Callable] = None, sum_inside_sqrt: bool = False):
    with tf.init_scope():  # reading the rate makes the optimizer's hyperparameter variables
      # here, under the strategy's scope, not in a replica of program A
      self._round_rate = tf.Variable(
          step_learning_rate(optimizer)(), trainable=False, name="engine_learning_rate",
          synchronization=tf.VariableSynchronization.ON_WRITE,
          aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    super().__init__(tables, optimizer, update_bounds, sum_inside_sqrt, engine_factory=(
        functools.partial(LiveEngine, input_bounds=feature_bounds(input_bounds, update_bounds),
                          api_factory=api_factory)))

  def _engine_learning_rate(self, optimizer):
    del optimizer
    return self._round_rate.read_value

  @contextlib.contextmanager
  def inference_round(self, ids: dict):
    """Program A's scope: lookups read the round the host enqueued for ``ids``.

    The program's one dequeue happens here, before the DP step's per-example forward passes
    (:mod:`sparse_dp.training.dp_step.per_example`).
    Each example's lookup then reads its rows from its own part of the dequeued activations
    (:meth:`~.tpu.TPUEmbeddingBackend._round_lookup`).
    Those are the engine's rows, the same whichever example asked.

    Args:
      ids: each table's ids in the batch, by layer name: int64 ``[B, k]``, row ``i`` example
        ``i``'s alone (:func:`sparse_dp.training.dp_step.input_ids.per_example_input_ids`).
    """
    activations = self.engine.dequeue_round(
        {table.name: self.engine.input_bounds[table.name] for table in self.tables})
    self._tracing.round = {name: example_round(ids[name], activations[name])
                           for name in ids}  # _round_lookup reads it
    self._tracing.pending = None
    try:
      yield
    finally:
      self._tracing.round = None

  @property
  def pending(self) -> Optional[tuple]:
    """The training round (ids, activation gradients) of the step this replica traced last."""
    return getattr(self._tracing, "pending", None)

  def apply_table_updates(self, optimizer, updates):
    """Holds the training round in ``pending``; reads the engine's learning rate of the step.

    Args:
      optimizer: the model's Keras optimizer, whose learning rate the engine takes.
      updates: ``{layer: update}``, each table's update from the DP step.

    Returns:
      A one-element list: the op that assigns the step's learning rate.
    """
    self._tracing.pending = self.training_round(updates)
    return [self._round_rate.assign(step_learning_rate(optimizer)())]

  def training_update(self, gradients: dict) -> None:
    """Program B: dequeues the training round and applies its activation ``gradients``.

    Args:
      gradients: ``{feature name: activation gradients}``, from :attr:`pending`.
    """
    self.engine.dequeue_round({})  # its activations are not used
    self.engine.send_gradients(gradients)

  def sync_tables(self) -> None:
    """Copies the engine's rows ``[0, V)`` into the layers (predict, evaluate, save).

    On a TPU the host copy of the tables is current only after a retrieval
    (the API's ``_retrieve_variables``, which a checkpoint save runs).
    """
    retrieve = getattr(self.engine.api, "_retrieve_variables", None)
    if retrieve is not None:
      retrieve()
    super().sync_tables()
