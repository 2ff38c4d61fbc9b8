"""Where embedding tables live and how a DP step's update reaches them.

The DP step (:mod:`sparse_dp.training.dp_step.step`) never touches a table: it
records each lookup's rows and vectors, and returns, per table, the update
its mechanisms produced: ``(sum_i [g_i]_C2 + noise) / B`` on the selected rows
(DP-AdaFEST, an ``IndexedSlices``) or on every row (DP-SGD, a dense tensor).
A backend answers the two questions the step leaves open:
:meth:`EmbeddingBackend.lookup` (the rows of a layer's ids, one vector per id) and
:meth:`EmbeddingBackend.apply_gradients` (how that update, and the dense weights'
gradients, are applied). :class:`CpuBackend` (CPU and GPU) keeps today's Keras variables
and sparse optimizers; :class:`~sparse_dp.layers.embedding_backends.tpu.TPUEmbeddingBackend`
expresses the same update in the TPU embedding API's terms. Neither computes a DP quantity.
See docs/tpu.md ("How the backends meet the API").
"""

from __future__ import annotations

import abc
import contextlib

import tensorflow as tf

from sparse_dp.distribute import shards
from sparse_dp.layers.embedding import gather_rows
from sparse_dp.mechanisms.rows.padding import ordinary_slices


class EmbeddingBackend(abc.ABC):
  """Lookups and the DP update of a model's :class:`~sparse_dp.layers.Embedding` tables.

  The DP step records each lookup's rows and vectors, and returns per table the update its
  mechanisms produced.
  A backend answers the two questions the step leaves open.
  :meth:`lookup` reads the rows of a layer's ids.
  :meth:`apply_gradients` applies that update and the dense weights' gradients.
  A backend computes no DP quantity.

  Args:
    tables: the model's :class:`~sparse_dp.layers.Embedding` layers.

  Attributes:
    name: what the reports print: ``"cpu"``, ``"tpu"``, ``"tpu-api-double"``,
      ``"tpu-sparsecore-api-double"`` or ``"tpu-engine-double"``.
    tables: the layers whose tables the backend holds.
  """

  #: What the reports print: ``"cpu"``, ``"tpu"``, ``"tpu-api-double"``,
  #: ``"tpu-sparsecore-api-double"`` or ``"tpu-engine-double"``.
  name: str = ""

  def __init__(self, tables: list):
    self.tables = list(tables)
    self._by_variable = {layer.embeddings.ref(): layer for layer in self.tables}

  @property
  def checkpointable(self):
    """The object that holds the tables' training state outside Keras (an
    engine's tables and optimizer slots), saved with the model's DP state;
    ``None`` where the Keras variables and optimizer hold it all."""
    return None

  def attach(self) -> None:
    """Routes the tables' lookups through this backend."""
    for layer in self.tables:
      layer.embedding_backend = self

  @contextlib.contextmanager
  def training_step(self, features):
    """The scope of one DP step's forward passes (when traced); nothing happens here.

    Args:
      features: the batch's model inputs.
    """
    del features
    yield

  def sync_tables(self) -> None:
    """Copies the tables an engine trains into the layers' Keras variables (none here)."""

  @abc.abstractmethod
  def lookup(self, layer, flat_ids: tf.Tensor) -> tuple:
    """Reads rows of ``layer``'s table.

    Args:
      layer (sparse_dp.layers.Embedding): one of :attr:`tables`.
      flat_ids: int64 ``[n]``, the rows to read.

    Returns:
      ``(rows, missing)``: ``[n, output_dim]``, the rows; ``missing``, bool ``[n]``, the ids
        this step cannot read (their rows NaN, so the DP step zeroes the example), or
        ``None`` where every id can be read.
    """

  def optimizer_variables(self, trainable_variables) -> list:
    """The variables :meth:`apply_gradients` hands to the model's optimizer.

    ``PrivateTraining.create_optimizer_weights`` makes their slots.
    Here they are the dense weights: the tables' updates, and their optimizer slots, are the
    engine's.

    Args:
      trainable_variables (list[tf.Variable]): the model's trainable variables.

    Returns:
      A list of the variables the model's optimizer updates.
    """
    return [v for v in trainable_variables if v.ref() not in self._by_variable]

  @abc.abstractmethod
  def apply_table_updates(self, optimizer, updates: dict) -> list:
    """Applies the tables' updates of one step.

    Args:
      optimizer (keras.optimizers.Optimizer): the model's Keras optimizer.
      updates: ``{layer: update}``, each table's update from the DP step.

    Returns:
      A list of the ops that update the step's selected rows.
    """

  def apply_gradients(self, optimizer, trainable_variables, gradients: dict) -> None:
    """Applies the step's gradients: the tables' here, the others by ``optimizer``.

    Args:
      optimizer (keras.optimizers.Optimizer): the model's Keras optimizer.
      trainable_variables (list[tf.Variable]): the model's trainable variables.
      gradients: the step's gradients, by variable ref.
    """
    tables = {self._by_variable[ref]: g for ref, g in gradients.items()
              if ref in self._by_variable}
    dense = [(gradients[v.ref()], v) for v in self.optimizer_variables(trainable_variables)
             if v.ref() in gradients]
    with tf.control_dependencies(self.apply_table_updates(optimizer, tables)):
      if dense:
        optimizer.apply_gradients(dense)
      else:  # every trained weight is a table: the step count still moves
        optimizer.iterations.assign_add(1)



class CpuBackend(EmbeddingBackend):
  """The tables are the layers' Keras variables, updated by the model's sparse optimizer.

  One ``optimizer.apply_gradients`` call takes every gradient, tables included, in the order
  of ``model.trainable_variables``.
  The step is the one sparse-dp has always taken, to the bit.
  It serves CPUs, GPUs and ordinary TPU variables.

  Args:
    tables: the model's :class:`~sparse_dp.layers.Embedding` layers.
  """

  name = "cpu"

  def lookup(self, layer, flat_ids):
    """Gathers rows of ``layer``'s Keras table variable.

    Args:
      layer (sparse_dp.layers.Embedding): one of :attr:`tables`.
      flat_ids: int64 ``[n]``, the rows to read.

    Returns:
      ``(rows, None)``: ``[n, output_dim]``, the rows; every id can be read.
    """
    return gather_rows(layer.embeddings, flat_ids), None

  def apply_table_updates(self, optimizer, updates):
    """Never called: :meth:`apply_gradients` applies the tables with the dense weights.

    Args:
      optimizer: the model's Keras optimizer.
      updates: ``{layer: update}``, each table's update.

    Raises:
      AssertionError: always.
    """
    raise AssertionError("CpuBackend applies tables with the dense weights")

  def optimizer_variables(self, trainable_variables) -> list:
    """Every trainable variable, the tables too: one optimizer updates them all.

    Args:
      trainable_variables (list[tf.Variable]): the model's trainable variables.

    Returns:
      A list of ``trainable_variables``.
    """
    return list(trainable_variables)  # the tables too: one optimizer updates them all

  def apply_gradients(self, optimizer, trainable_variables, gradients):
    """Applies every gradient, tables included, in one ``optimizer.apply_gradients`` call.

    A table's gradient is split by parameter-server shard where the table is sharded.

    Args:
      optimizer (keras.optimizers.Optimizer): the model's Keras optimizer.
      trainable_variables (list[tf.Variable]): the model's trainable variables.
      gradients: the step's gradients, by variable ref.
    """
    # A table update's padding (index PAD, zero values) goes to row 0: Keras sums repeated
    # indices, and a zero sum leaves a row as it is (sparse_dp.optimizers).
    gradients = {ref: ordinary_slices(g) for ref, g in gradients.items()}
    gradients = shards.split_by_shard(gradients)  # tables sharded across parameter servers
    # Without a strategy the sum over replicas is the identity, but Keras's sum of
    # dense gradients passes them all through one IdentityN op: every dense table
    # gradient (DP-SGD's) would be held until the last is made, instead of each
    # applied as soon as it is.
    optimizer.apply_gradients([(gradients[v.ref()], v)
                               for v in self.optimizer_variables(trainable_variables)
                               if v.ref() in gradients],
                              experimental_aggregate_gradients=tf.distribute.has_strategy())
