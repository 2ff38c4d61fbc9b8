"""An embedding layer whose lookups DP training can clip and noise row by row."""

from __future__ import annotations

import logging
from typing import Optional

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.embedding_tables import mark_embedding_table
from sparse_dp.layers import row_gather
from sparse_dp.layers.recording import Lookup, is_recording, record_lookup
from sparse_dp.layers.table_placement import check_placement, variables_placed
from sparse_dp.mechanisms.rows.scans import compiling_with_xla

_COMBINERS = ("sum", "mean", None)


def gather_rows(table, ids: tf.Tensor) -> tf.Tensor:
  """Rows ``ids`` of ``table``, a variable or a ``ShardedVariable`` (parameter servers).

  A sharded table is read with ``tf.nn.embedding_lookup`` (its shards hold
  contiguous row ranges): on TF 2.15 ``tf.gather`` of a ``ShardedVariable``
  with a tensor of ids returned other rows than the shards hold once a
  ``ClusterCoordinator`` existed (tests/integration/test_parameter_servers.py).

  Inside a DP step (a :func:`~sparse_dp.layers.recording.recording` scope),
  where each example's forward pass runs alone under ``tf.vectorized_map``,
  the gathers are the vectorisable ones of :mod:`sparse_dp.layers.row_gather`.
  """
  sharded = hasattr(table, "variables") and not hasattr(table, "ref")
  if is_recording():
    return (row_gather.gather_from_shards(table.variables, ids) if sharded
            else row_gather.gather_from_variable(table, ids))
  return tf.nn.embedding_lookup(table, ids) if sharded else tf.gather(table, ids)


def out_of_vocabulary_message(layer: str, vocabulary_size: int) -> str:
  """Why a lookup of ids outside ``[0, vocabulary_size)`` fails, and the fix.

  It names the layer and the vocabulary, never an id (the private data) nor how many
  (an un-noised statistic of it).

  Args:
    layer: the Embedding layer's name.
    vocabulary_size: its table's rows.

  Returns:
    The message.
  """
  return (f"Embedding layer {layer}: ids outside its vocabulary [0, {vocabulary_size}) "
          "(not printed: ids are private data); map the ids into [0, vocabulary_size) "
          "before the layer (hash or bucket them, or give the layer a larger vocabulary_size)")


def leading_dimension(tensor: tf.Tensor) -> tf.Tensor:
  """``tensor``'s first dimension as an int64 scalar, a constant when it is static."""
  static = tensor.shape[0]
  return (tf.constant(static, tf.int64) if static is not None
          else tf.shape(tensor, out_type=tf.int64)[0])


class _SameNameWarningFilter(logging.Filter):
  """Drops Keras's SavedModel warning that this class shares the name ``Embedding``.

  Keras warns for every saved layer whose class name is a built-in's; ours is
  registered as ``sparse_dp>Embedding``, so loading is unambiguous (tested in
  tests/unit/layers/test_embedding_layer.py), and 26 such lines per save only hide real warnings.
  """

  def filter(self, record: logging.LogRecord) -> bool:
    return f"{__name__}.Embedding object" not in record.getMessage()


logging.getLogger("absl").addFilter(_SameNameWarningFilter())

# Words of the ``dp_record`` weight: the DP history of the runs that trained a
# layer (sparse_dp.training.dp_state.dp_record), about 32 KB.
DP_RECORD_WORDS = 4096


def add_dp_record(layer: keras.layers.Layer) -> tf.Variable:
  """Adds ``layer`` the non-trainable ``dp_record`` weight (zeros: never trained privately).

  A weight, so every Keras format (``.h5``, ``.keras``, ``get_weights``, TF
  checkpoints, SavedModel) carries the privacy spent on the layer with it. The DP
  step updates it once per step on the first replica.
  """
  return layer.add_weight(
      name="dp_record", shape=(DP_RECORD_WORDS,), dtype=tf.int64, initializer="zeros",
      trainable=False, synchronization=tf.VariableSynchronization.ON_WRITE,
      aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


@keras.utils.register_keras_serializable(package="sparse_dp")
class Embedding(keras.layers.Layer):
  """One embedding table of ``vocabulary_size`` rows of ``output_dim``.

  Ids may be:

  * a dense ``[B]`` tensor (single-valent): output ``[B, output_dim]``;
  * a dense ``[B, L]`` tensor: with ``combiner`` ``"sum"`` or ``"mean"`` output
    ``[B, output_dim]``; with ``combiner=None`` one vector per token,
    ``[B, L, output_dim]`` (text models);
  * a ``tf.RaggedTensor [B, None]`` or ``tf.SparseTensor [B, L]`` (multi-valent),
    combined by ``combiner`` into ``[B, output_dim]``; an empty row gives zeros.

  An id repeated within one example is looked up once per occurrence, so a sum counts it twice.
  Call the same layer on several features, or on every token of a sequence, to share one table
  among them.

  Ids outside ``[0, vocabulary_size)`` fail with an error naming the layer and the
  vocabulary size (never the id, which is private data), also inside ``tf.function``.
  Nothing is clamped.
  The forward pass uses only ``tf.gather`` and segment sums, so an exported SavedModel serves
  with plain TensorFlow.

  DP training does not touch the table variable directly.
  Each call reports its row ids and the gathered vectors to :mod:`sparse_dp.layers.recording`,
  and the DP step works on those.
  So the lookup itself can be replaced (by the TPU embedding API, say) without changing the
  mechanisms.

  Args:
    vocabulary_size: the table's rows, an integer >= 1.
    output_dim: the dimension of each row, an integer >= 1.
    combiner: how an example's vectors combine into one: ``"sum"``, ``"mean"`` or ``None``.
      ``None`` gives one vector per token and takes dense ``[B]`` or ``[B, L]`` ids only.
    embeddings_initializer (str | keras.initializers.Initializer): the table's Keras initializer.
    embeddings_regularizer (None): must be ``None``. A regularizer adds a gradient to every row
      of the table, which would make DP updates dense; use the optimizer's decoupled weight
      decay instead.
    mask_zero: Keras semantics: id 0 is padding, and ``compute_mask`` returns ``ids != 0`` for
      downstream layers that take a mask (pooling, attention, RNNs). Row 0 is still a row of
      the table. The output must keep the ids' shape for a mask to mean anything, so it needs
      ``combiner=None`` for ``[B, L]`` ids (or ``[B]`` ids). A mask is computed from each
      example's own ids, so it keeps each example's loss its own.
    table_placement: where the table variable lives
      (:mod:`sparse_dp.layers.table_placement`). ``"default_device"`` is where the strategy
      puts any weight. ``"host"`` is one copy in host memory, for a table the TPU embedding
      engine trains, so that it takes no TensorCore HBM.
    **kwargs (Any): the arguments of a Keras ``Layer``, such as ``name`` and ``dtype``.

  Attributes:
    embeddings: the table variable, ``[vocabulary_size, output_dim]``, made by ``build``.
    embedding_backend: what the lookups go through; ``make_private`` sets it
      (:mod:`sparse_dp.layers.embedding_backends`). ``None``, the default, gathers from
      ``embeddings``.

  Raises:
    ValueError: a ``vocabulary_size`` or ``output_dim`` that is not an integer >= 1; a
      ``combiner`` other than ``"sum"``, ``"mean"`` and ``None``; an unknown
      ``table_placement``; or an ``embeddings_regularizer``.
  """

  def __init__(self, vocabulary_size: int, output_dim: int, combiner: Optional[str] = "sum",
               embeddings_initializer="uniform", embeddings_regularizer=None,
               mask_zero: bool = False, table_placement: str = "default_device", **kwargs):
    super().__init__(**kwargs)
    if not isinstance(vocabulary_size, int) or vocabulary_size < 1:
      raise ValueError(f"layer '{self.name}': vocabulary_size must be an integer >= 1, "
                       f"got {vocabulary_size!r}")
    if not isinstance(output_dim, int) or output_dim < 1:
      raise ValueError(f"layer '{self.name}': output_dim must be an integer >= 1, "
                       f"got {output_dim!r}")
    if combiner not in _COMBINERS:
      raise ValueError(f"layer '{self.name}': combiner must be 'sum', 'mean' or None, "
                       f"got {combiner!r}")
    if embeddings_regularizer is not None:
      raise ValueError(f"layer '{self.name}': regularizers add a gradient to every row "
                       "of the table, which would make DP updates dense; use the "
                       "optimizer's decoupled weight decay instead")
    self.vocabulary_size = vocabulary_size
    self.output_dim = output_dim
    self.combiner = combiner
    self.mask_zero = mask_zero
    self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
    self.table_placement = check_placement(table_placement, self.name)
    self.embedding_backend = None

  def build(self, input_shape):
    """Makes the table variable (where ``table_placement`` says) and the ``dp_record`` weight.

    Args:
      input_shape: the shape of the ids (Keras's; the table's shape does not depend on it).
    """
    with variables_placed(self.table_placement, self.name):
      self.embeddings = self.add_weight(
          name="embeddings", shape=(self.vocabulary_size, self.output_dim),
          initializer=self.embeddings_initializer, trainable=True)
    mark_embedding_table(self.embeddings)  # RowwiseAdagrad's one accumulator per row
    self.dp_record = add_dp_record(self)
    super().build(input_shape)

  def call(self, ids):
    """Looks up ``ids`` and combines each example's vectors by ``combiner``.

    Under XLA, where the check of the ids compiles away, an id outside the vocabulary reads
    row 0 as NaN, and the DP step zeroes that example's gradient and reports it; so does an
    id an example did not send a TPU embedding engine, in the engine's DP step.

    Args:
      ids (tf.Tensor | tf.RaggedTensor | tf.SparseTensor): dense ``[B]`` or ``[B, L]`` ids, a
        ``tf.RaggedTensor`` ``[B, None]`` or a ``tf.SparseTensor`` ``[B, L]``.

    Returns:
      (tf.Tensor): ``[B, output_dim]``, or ``[B, L, output_dim]`` for ``[B, L]`` ids with
        ``combiner=None``.

    Raises:
      ValueError: ragged ids not ``[batch, None]``, dense ids of a rank other than 1 or 2, or
        ragged or sparse ids with ``combiner=None``.
      tf.errors.InvalidArgumentError: an id outside ``[0, vocabulary_size)``, outside XLA.
    """
    return self._looked_up(ids)

  @tf.autograph.experimental.do_not_convert  # no tensor control flow: plain Python traces it
  def _looked_up(self, ids):
    example, flat_ids, batch_size = self._flatten(ids)
    outside = None
    if compiling_with_xla():  # XLA would compile the check away: see _outside_as_nan
      flat_ids, outside = self._outside_as_nan(tf.cast(flat_ids, tf.int64))
    else:
      flat_ids = self._checked(flat_ids)
    vectors, missing = ((gather_rows(self.embeddings, flat_ids), None)
                        if self.embedding_backend is None
                        else self.embedding_backend.lookup(self, flat_ids))
    vectors = tf.cast(vectors, self.compute_dtype)  # a mixed policy's 16 bits, as Keras's Embedding
    if missing is not None:  # ids an engine's step cannot read: zeroed and reported as outside
      outside = missing if outside is None else tf.logical_or(outside, missing)
    if outside is not None:
      vectors = tf.where(outside[:, None], tf.constant(float("nan"), vectors.dtype), vectors)
    record_lookup(Lookup(self, example, flat_ids, vectors, batch_size, outside))
    if isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)):
      if self.combiner is None:
        raise ValueError(f"layer '{self.name}': ragged or sparse ids need a combiner "
                         "('sum' or 'mean'); combiner=None takes dense [batch, L] ids")
      return self._combine(vectors, example, batch_size)
    if ids.shape.rank == 1:
      return vectors
    if self.combiner is None:
      return tf.reshape(vectors, tf.concat([tf.shape(ids), [self.output_dim]], axis=0))
    return self._combine(vectors, example, batch_size)

  def _flatten(self, ids):
    """``(example index, id)`` per lookup, and the batch size."""
    if isinstance(ids, tf.RaggedTensor):
      if ids.ragged_rank != 1:
        raise ValueError(f"layer '{self.name}': ragged ids must be [batch, None]")
      return ids.value_rowids(), ids.flat_values, ids.nrows()
    if isinstance(ids, tf.SparseTensor):
      return ids.indices[:, 0], ids.values, ids.dense_shape[0]
    if ids.shape.rank not in (1, 2):
      raise ValueError(f"layer '{self.name}': dense ids must be [batch] or [batch, L], "
                       f"got shape {ids.shape}")
    batch = leading_dimension(ids)
    if ids.shape.rank == 1:
      return tf.range(batch), ids, batch
    width = tf.shape(ids, out_type=tf.int64)[1]
    return tf.repeat(tf.range(batch), width), tf.reshape(ids, [-1]), batch

  def _checked(self, flat_ids):
    """``flat_ids`` as int64, after an assert that they are in the vocabulary.

    The error names the layer, the vocabulary and the fix, never an id (the private data)
    nor how many are outside (an un-noised statistic of it).
    """
    flat_ids = tf.cast(flat_ids, tf.int64)
    check = tf.debugging.Assert(tf.reduce_all(tf.logical_not(self._outside(flat_ids))),
                                [out_of_vocabulary_message(self.name, self.vocabulary_size)])
    with tf.control_dependencies([check]):
      return tf.identity(flat_ids)

  def _outside_as_nan(self, flat_ids):
    """Under XLA, ids outside the vocabulary read row 0 as NaN (and are returned marked).

    XLA drops the assert of :meth:`_checked` and clamps an out-of-range
    gather to the last row: a wrong id would silently train another row
    (and inside the DP step's ``tf.vectorized_map`` that assert's data made
    XLA compile the step again for every new batch). Here
    its vectors are NaN, so the DP step zeroes that example's gradient (the
    update does not depend on it) and reports the count, which ``fit``
    refuses on the host (:mod:`sparse_dp.training.wrappers.host_guards`).
    """
    outside = self._outside(flat_ids)
    return tf.where(outside, tf.zeros_like(flat_ids), flat_ids), outside

  def _outside(self, flat_ids):
    """``id < 0 or id >= vocabulary_size`` for int64 ids, as one unsigned comparison (a
    negative id is 2^64 + id as uint64)."""
    return tf.cast(flat_ids, tf.uint64) >= tf.constant(self.vocabulary_size, tf.uint64)

  def _combine(self, vectors, example, batch_size):
    example = tf.cast(example, tf.int32)
    segments = tf.cast(batch_size, tf.int32)
    summed = tf.math.unsorted_segment_sum(vectors, example, segments)
    if self.combiner == "mean":
      counts = tf.math.unsorted_segment_sum(tf.ones_like(example, vectors.dtype), example, segments)
      summed = summed / tf.maximum(counts, 1.0)[:, None]
    return summed

  def compute_mask(self, ids, mask=None):
    """The mask ``ids != 0`` with ``mask_zero``, for dense ids whose output keeps their shape.

    Args:
      ids (tf.Tensor | tf.RaggedTensor | tf.SparseTensor): the ids the layer is called on.
      mask (tf.Tensor | None): the incoming mask, ignored.

    Returns:
      (tf.Tensor | None): bool of the shape of ``ids``, or ``None`` without ``mask_zero``.

    Raises:
      ValueError: ``mask_zero`` on ragged or sparse ids, or on ``[B, L]`` ids that a
        ``combiner`` combines into one vector per example.
    """
    if not self.mask_zero:
      return None
    if isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)) or (
        ids.shape.rank != 1 and self.combiner is not None):
      raise ValueError(
          f"layer '{self.name}': mask_zero=True masks one output per id, but combiner "
          f"'{self.combiner}' combines the ids {ids.shape} of each example into one vector, "
          "which has nothing to mask; use combiner=None on dense [batch, L] ids (one vector "
          "per token, masked where the id is 0), or ragged ids without padding and no mask_zero")
    return tf.not_equal(ids, 0)

  def compute_output_shape(self, input_shape):
    """The shape of the output for ids of ``input_shape``.

    Args:
      input_shape: the shape of the ids, ``[B]`` or ``[B, L]``.

    Returns:
      A ``tf.TensorShape``: ``[B, L, output_dim]`` for ``[B, L]`` ids with ``combiner=None``,
        else ``[B, output_dim]``.
    """
    input_shape = tf.TensorShape(input_shape)
    if input_shape.rank == 2 and self.combiner is None:
      return input_shape.concatenate([self.output_dim])
    return tf.TensorShape([input_shape[0], self.output_dim])

  def get_config(self):
    """The layer's configuration, for Keras serialization.

    Returns:
      A dict: the ``Layer`` config with the arguments of ``__init__`` (the initializer
        serialized).
    """
    return {**super().get_config(), "vocabulary_size": self.vocabulary_size,
            "output_dim": self.output_dim, "combiner": self.combiner,
            "mask_zero": self.mask_zero, "table_placement": self.table_placement,
            "embeddings_initializer": keras.initializers.serialize(
                self.embeddings_initializer)}
