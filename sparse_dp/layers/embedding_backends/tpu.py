"""The DP update of a table in the TPU embedding API's own terms.

On TPU the tables live in the embedding engine, which applies its optimizer itself to the
activation gradients of each feature's lookups (rules: :mod:`.doubles.engine_double`), so a DP
step reaches a table only through lookups. :class:`TPUEmbeddingBackend` expresses the update
the step already produced (:mod:`sparse_dp.mechanisms`), computing no DP quantity: each table
gets an engine table of ``V + 1`` rows (row ``V`` a dummy row no model id looks up) and two
features, ``<layer>`` (the model's lookups, an inference round) and ``<layer>/dp_update`` (the
selected rows padded to ``M`` with the dummy). The training round masks ``<layer>`` to the
dummy and sends the noisy update on ``<layer>/dp_update``, so the engine's scatter-add gives
each selected row exactly ``(sum_i [g_i]_C2 + N(0, sigma2^2 C2^2)) / B`` and no other row
moves. DP-SGD sends every row (``M = V``). Adam's bias correction is passed as the engine's
learning rate ``lr sqrt(1 - b2^t) / (1 - b1^t)``. See docs/tpu.md ("The DP update in the API's
terms").
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Optional

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.layers.embedding import gather_rows
from sparse_dp.layers.embedding_backends.base import EmbeddingBackend
from sparse_dp.layers.embedding_backends.doubles.engine_double import EngineDouble
from sparse_dp.layers.embedding_backends.hardware import TRAINER_ONLY
from sparse_dp.layers.recording import recorded_example
from sparse_dp.mechanisms.rows.padding import is_valid
from sparse_dp.mechanisms.rows.scans import compiling_with_xla
from sparse_dp.mechanisms.rows.sorted_ids import sorted_lookup
from sparse_dp.optimizers import LazyAdam, RowwiseAdagrad

_API = tf.tpu.experimental.embedding
UPDATE_SUFFIX = "/dp_update"


def update_feature(update, vocabulary_size: int, bound: int):
  """``(ids [bound], activation gradients [bound, d])`` whose scatter-add is ``update``.

  ``update`` is the step's gradient of one table: an ``IndexedSlices`` on its
  selected rows (a padded row list: distinct rows, then ``PAD`` with zero
  values), or a dense ``[V, d]`` tensor (DP-SGD: every row). The padding is the
  dummy row ``vocabulary_size`` with zero gradients.
  """
  if isinstance(update, tf.IndexedSlices):
    selected = is_valid(update.indices)
    rows = tf.cast(tf.where(selected, update.indices, vocabulary_size), tf.int32)
    values = tf.convert_to_tensor(update.values)
    count = tf.math.count_nonzero(selected, dtype=tf.int32)
  else:
    rows, values = tf.range(vocabulary_size), tf.convert_to_tensor(update)
    count = tf.size(rows)
  fits = tf.debugging.assert_less_equal(count, bound, message=(
      f"sparse-dp: this step selected more rows than the TPU update feature's static bound "
      f"{bound} (a bound a correct run exceeds with probability <= 1e-9 per step); rerun "
      "with a larger bound or the CPU backend"))
  with tf.control_dependencies([fits]):  # the rows come first: the cut keeps them all
    ids = tf.concat([rows, tf.fill([bound], vocabulary_size)], 0)[:bound]
  gradients = tf.concat([values, tf.zeros([bound, values.shape[1]], values.dtype)], 0)[:bound]
  return ids, gradients


def example_round(ids: tf.Tensor, activations: tf.Tensor) -> tuple:
  """One table's engine lookup of a batch, by example: ``(ids [B + 1, k], rows [B + 1, k, d])``.

  Args:
    ids: int ``[B, k]`` (or ``[B]``, ``k = 1``), each example's ids
      (:func:`~sparse_dp.training.dp_step.input_ids.per_example_input_ids`).
    activations: ``[n >= B k, d]``, the engine's rows of the ids flattened, in their order.

  Returns:
    Example ``i``'s ids and rows at ``i``; at ``B``, ids ``-1`` (no id) and NaN rows, the
    part of a position outside the batch.
  """
  width, dim = ids.shape[1:].num_elements(), activations.shape[-1]
  ids = tf.reshape(tf.cast(ids, tf.int64), [-1, width])
  rows = tf.reshape(activations[:tf.size(ids)], [-1, width, dim])
  return (tf.concat([ids, tf.fill([1, width], tf.constant(-1, tf.int64))], 0),
          tf.concat([rows, tf.fill([1, width, dim], tf.constant(float("nan"), rows.dtype))], 0))


def _search(ids: tf.Tensor, queries: tf.Tensor) -> tuple:
  """``(index, found)``: where ``ids[index] == queries``, in O((n + m) log m) by a sort."""
  order = tf.argsort(ids, stable=True)
  slot, found = sorted_lookup(tf.gather(ids, order), queries)
  return tf.gather(order, tf.minimum(slot, tf.size(order, out_type=tf.int64) - 1)), found


def feature_bounds(input_bounds: dict, update_bounds: dict) -> dict:
  """The static length of each table's two features, by name: ``<layer>`` takes the most ids
  the layer looks up per step (``input_bounds[layer]``), ``<layer>/dp_update`` ``M``."""
  bounds = {}
  for layer, bound in input_bounds.items():
    bounds[layer.name] = int(bound)
    bounds[layer.name + UPDATE_SUFFIX] = int(update_bounds[layer])
  return bounds


def step_learning_rate(optimizer: keras.optimizers.Optimizer) -> Callable[[], tf.Tensor]:
  """The engine's learning rate for the step the dense weights take next.

  The Keras optimizer's (schedules included), bias-corrected for Adam at step
  ``t = optimizer.iterations + 1``: read it before the dense update.
  """
  def learning_rate():
    return optimizer._decayed_lr(tf.float32)

  if not isinstance(optimizer, LazyAdam):
    return learning_rate
  config = optimizer.get_config()
  beta_1, beta_2 = config["beta_1"], config["beta_2"]

  def corrected():
    t = tf.cast(optimizer.iterations + 1, tf.float32)
    return learning_rate() * tf.sqrt(1.0 - beta_2 ** t) / (1.0 - beta_1 ** t)

  return corrected


def engine_optimizer(optimizer: keras.optimizers.Optimizer, sum_inside_sqrt: bool = False,
                     learning_rate: Optional[Callable] = None):
  """The engine optimizer equivalent to the model's sparse Keras optimizer.

  Its learning rate is a callable read at each training round: by default
  :func:`step_learning_rate`, read in the round before the dense update.
  """
  config = optimizer.get_config()
  name = type(optimizer).__name__
  learning_rate = learning_rate or step_learning_rate(optimizer)
  if isinstance(optimizer, LazyAdam):
    if optimizer.weight_decay:
      raise ValueError("the TPU embedding backend does not take LazyAdam's weight_decay "
                       "(the engine's weight_decay_factor is not modelled by its test "
                       "double); drop the decay or use --embedding cpu")
    return _API.Adam(learning_rate, beta_1=config["beta_1"], beta_2=config["beta_2"],
                     epsilon=config["epsilon"], lazy_adam=True, sum_inside_sqrt=sum_inside_sqrt)
  if name == "SGD" and not config.get("momentum") and not config.get("nesterov"):
    return _API.SGD(learning_rate)
  if isinstance(optimizer, RowwiseAdagrad):
    raise ValueError("the TPU embedding engine has no row-wise Adagrad (its Adagrad keeps one "
                     "accumulator per coordinate, tf.tpu.experimental.embedding has no "
                     "per-row one): --optimizer rowwise-adagrad (RowwiseAdagrad) trains with "
                     "--embedding cpu; with --embedding tpu use --optimizer adagrad, "
                     "lazy-adam, adam or sgd")
  if name == "Adagrad":
    return _API.Adagrad(learning_rate,
                        initial_accumulator_value=config["initial_accumulator_value"])
  raise ValueError(f"the TPU embedding backend has no engine optimizer for {name} "
                   f"({config}); use SGD without momentum, Adagrad or Adam (LazyAdam)")


class TPUEmbeddingBackend(EmbeddingBackend):
  """The tables in a TPU embedding engine; off TPU, in :class:`EngineDouble`.

  The engine applies its optimizer itself to the activation gradients of each feature's
  lookups, so a DP step reaches a table only through lookups.
  Each table gets an engine table of ``V + 1`` rows; row ``V`` is a dummy row that no model id
  looks up.
  Each table also gets two features: ``<layer>``, the model's lookups, and
  ``<layer>/dp_update``, the selected rows padded to ``M`` with the dummy row.
  The training round masks ``<layer>`` to the dummy row and sends the noisy update on
  ``<layer>/dp_update``.
  So the engine's scatter-add gives each selected row exactly
  ``(sum_i [g_i]_C2 + N(0, sigma2^2 C2^2)) / B``, and no other row moves.
  DP-SGD sends every row (``M = V``).
  Adam's bias correction is passed as the engine's learning rate
  ``lr sqrt(1 - b2^t) / (1 - b1^t)``.
  The backend computes no DP quantity.

  Args:
    tables: the model's :class:`~sparse_dp.layers.Embedding` layers.
    optimizer: the model's sparse Keras optimizer, which the engine's optimizer reproduces:
      ``SGD`` without momentum, ``Adagrad``, or :class:`~sparse_dp.optimizers.LazyAdam`
      without weight decay.
    update_bounds: ``update_bounds[layer]``, the static length ``M`` of the layer's update
      feature: the most rows one step may select (``V`` for DP-SGD).
    sum_inside_sqrt: the engine Adam's ``sum_inside_sqrt``, which divides by
      ``sqrt(v + eps^2)`` in place of ``sqrt(v) + eps``.
    engine_factory: ``engine_factory(feature_config, optimizer)`` makes the engine: an
      :class:`EngineDouble` (default) or a
      :class:`~sparse_dp.layers.embedding_backends.live_engine.LiveEngine`.

  Attributes:
    engine: the engine, which holds the tables and their optimizer slots.
    engine_optimizer: the engine's optimizer, equivalent to ``optimizer``.
    feature_config: ``{feature name: FeatureConfig}``, the two features of each table.
    update_bounds: ``M`` of each layer.

  Raises:
    ValueError: an update bound above its layer's vocabulary, or an optimizer the engine has
      no equivalent for (SGD with momentum, RowwiseAdagrad, LazyAdam with weight decay, any
      other).
  """

  def __init__(self, tables: list, optimizer: keras.optimizers.Optimizer,
               update_bounds: dict, sum_inside_sqrt: bool = False,
               engine_factory: Optional[Callable] = None):
    super().__init__(tables)
    for layer in self.tables:
      if update_bounds[layer] > layer.vocabulary_size:
        raise ValueError(f"update bound of {layer.name} exceeds its vocabulary")
    self.update_bounds = dict(update_bounds)
    self.engine_optimizer = engine_optimizer(optimizer, sum_inside_sqrt,
                                             self._engine_learning_rate(optimizer))
    self.feature_config = {}
    for layer in self.tables:
      table = _API.TableConfig(vocabulary_size=layer.vocabulary_size + 1, dim=layer.output_dim,
                               initializer=self._table_initializer(layer), combiner="sum",
                               name=layer.name)
      for feature in (layer.name, layer.name + UPDATE_SUFFIX):
        self.feature_config[feature] = _API.FeatureConfig(table=table, name=feature)
    # The state of the step being traced, per replica: MirroredStrategy traces each replica
    # in a thread of its own, switching between them at its synchronisation points.
    self._tracing = threading.local()
    with tf.init_scope():
      self.engine = (engine_factory or EngineDouble)(self.feature_config, self.engine_optimizer)
      self.engine.build()
    self.name = self.engine.backend_name

  @contextlib.contextmanager
  def training_step(self, features):
    """Marks this replica as tracing a DP step's forward passes, for the scope.

    Args:
      features: the batch's model inputs (unused).
    """
    del features
    self._tracing.in_step = True
    try:
      yield
    finally:
      self._tracing.in_step = False

  @property
  def _in_step(self) -> bool:
    """Whether this replica is tracing a DP step's forward passes."""
    return getattr(self._tracing, "in_step", False)

  @property
  def checkpointable(self):
    """The engine's tables and slots (on a TPU, a save retrieves them first)."""
    return self.engine.checkpointable

  #: Whether a DP step's lookups read the engine's lookup of the batch (:meth:`_round_lookup`).
  reads_engine_in_step = False

  def lookup(self, layer, flat_ids):
    """Reads rows from the engine's lookup of the batch in a DP step, else from ``embeddings``.

    The engine's lookup is read in a DP step of an engine read in the step
    (:attr:`reads_engine_in_step`).
    Without one, every step keeps the layer's ``embeddings`` equal to the engine's rows
    ``[0, V)`` (:meth:`_copy_rows`), and the step reads them.
    Its update still goes through the engine.

    Args:
      layer (sparse_dp.layers.Embedding): one of :attr:`tables`.
      flat_ids (tf.Tensor): int64 ``[n]``, the rows to read.

    Returns:
      ``(rows [n, output_dim], missing)``: ``missing``, bool ``[n]``, the ids an example
        reads in the step that it did not send the engine (:meth:`_round_lookup`), else
        ``None``.

    Raises:
      RuntimeError: in the DP step of an engine read in the step, with no lookup of the
        batch (Keras ``fit`` of tables in the V1 engine).
    """
    if self._in_step and self.reads_engine_in_step:
      return self._round_lookup(layer, flat_ids)
    return gather_rows(layer.embeddings, flat_ids), None

  def _round_lookup(self, layer, flat_ids: tf.Tensor) -> tuple:
    """The rows of ``flat_ids`` from the step's engine lookup, and the ids it cannot read.

    ``self._tracing.round[layer.name]``: the engine's lookup of the batch by example
    (:func:`example_round`), made once per step before the per-example forward passes of
    :mod:`sparse_dp.training.dp_step.per_example`. An example reads only its own part, found
    by its position (:func:`~sparse_dp.layers.recording.recorded_example`): an id it did not
    send the engine is missing, whichever other example sent it, and reads a NaN row, so
    the DP step zeroes that example and reports it. What an example reads depends on its own
    features and the engine's rows alone. A pass over the whole batch (Keras metrics) reads
    every example's part.
    """
    round_ = getattr(self._tracing, "round", None)
    if round_ is None:
      raise RuntimeError(TRAINER_ONLY)
    ids, rows = round_[layer.name]
    position = recorded_example()
    flat_ids = tf.cast(flat_ids, tf.int64)
    in_batch = True
    if position is None:
      rows = tf.reshape(rows, [-1, rows.shape[-1]])
      index, found = _search(tf.reshape(ids, [-1]), flat_ids)
    else:  # a position outside the batch (the discarded spare of an empty batch) reads the
      # last part, which has no ids
      last = tf.shape(ids, out_type=tf.int64)[0] - 1
      position = tf.cast(position, tf.int64)
      in_batch = tf.logical_and(position >= 0, position < last)
      part = tf.where(in_batch, position, last)
      ids, rows = tf.gather(ids, part), tf.gather(rows, part)
      # an example sends a few ids: comparing each pair is O(n k)
      match = tf.equal(flat_ids[:, None], ids[None, :])
      index = tf.argmax(tf.cast(match, tf.int32), axis=1, output_type=tf.int64)
      found = tf.reduce_any(match, axis=1)
    missing = tf.logical_not(found)
    vectors = tf.gather(rows, index)
    checks = [] if compiling_with_xla() else [tf.debugging.Assert(
        tf.logical_not(tf.reduce_any(tf.logical_and(missing, in_batch))),
        [f"sparse-dp: an example looked up ids of layer {layer.name} that it did not send the "
         "TPU embedding engine (the input_ids of make_private or TPUTrainer give each "
         "table's ids of an example, as the layer looks them up)"])]
    with tf.control_dependencies(checks):
      return tf.where(missing[:, None], tf.constant(float("nan"), rows.dtype), vectors), missing

  def _table_initializer(self, layer) -> Callable:
    """The engine table's initializer: the layer's rows and a dummy row (:func:`_initial_rows`)."""
    return _initial_rows(layer)

  def _engine_learning_rate(self, optimizer) -> Optional[Callable]:
    """The engine optimizer's learning rate; ``None``: :func:`step_learning_rate`."""
    del optimizer
    return None

  def apply_table_updates(self, optimizer, updates):
    """The engine's update of the step's rows, then their copy into the Keras tables.

    Args:
      optimizer: the model's Keras optimizer (unused: the engine has its own).
      updates: ``{layer: update}``, each table's update from the DP step.

    Returns:
      A list of the ops, one per table, that copy the updated rows into
        ``layer.embeddings``.
    """
    features, gradients = self.training_round(updates)
    applied = self.engine.apply_gradients(features, gradients)
    with tf.control_dependencies([applied]):
      return [self._copy_rows(layer, features[layer.name + UPDATE_SUFFIX])
              for layer in self.tables]

  def training_round(self, updates: dict) -> tuple:
    """The training round that applies the tables' ``updates``.

    Args:
      updates: ``{layer: update}``, each table's update from the DP step; a table without
        one gets none.

    Returns:
      ``(ids, activation gradients)``, each a dict by feature name.
    """
    features, gradients = {}, {}
    for layer in self.tables:
      dummy, width = layer.vocabulary_size, layer.output_dim
      update = updates.get(layer, tf.IndexedSlices(tf.zeros([0, width]), tf.zeros([0], tf.int64)))
      name = layer.name + UPDATE_SUFFIX
      features[name], gradients[name] = update_feature(update, dummy,
                                                       self.update_bounds[layer])
      # The model's lookups are masked to the dummy row: they take no part in the update.
      features[layer.name] = tf.fill([1], dummy)
      gradients[layer.name] = tf.zeros([1, width])
    return features, gradients

  def _copy_rows(self, layer, ids: tf.Tensor) -> tf.Operation:
    """The engine's rows of the update feature's ``ids`` into ``layer.embeddings``.

    Kept for saving, serving and predict, and read by the forward pass. On a
    TPU a checkpoint save retrieves the tables; here a scatter of the step's
    ``M`` rows (all ``V`` for DP-SGD).
    """
    # The dummy row's places copy row 0, unchanged or not, from the engine: a consistent copy.
    rows = tf.where(ids < layer.vocabulary_size, ids, 0)
    return layer.embeddings.scatter_update(tf.IndexedSlices(self._engine_rows(layer, rows), rows))

  def _engine_rows(self, layer, rows: tf.Tensor) -> tf.Tensor:
    """The engine's current values of the layer's ``rows`` (a gather of its table)."""
    return tf.gather(self.engine.slots(layer.name)["parameters"], rows)

  def table_rows(self, layer) -> tf.Tensor:
    """The layer's engine table without its dummy row.

    Args:
      layer (sparse_dp.layers.Embedding): one of :attr:`tables`.

    Returns:
      ``[V, output_dim]``, rows ``[0, V)`` of the engine's table.
    """
    return self.engine.slots(layer.name)["parameters"][:layer.vocabulary_size]

  def sync_tables(self) -> None:
    """Copies the engine's rows ``[0, V)`` into the layers (predict, evaluate, save)."""
    for layer in self.tables:
      layer.embeddings.assign(self.table_rows(layer))

  def export_for_serving(self) -> _API.TPUEmbeddingForServing:
    """The trained tables and slots as a ``TPUEmbeddingForServing`` of ``V``-row tables.

    Its checkpoint is what CPU serving restores (``tf.train.Checkpoint(embedding=...)``).
    It holds table ``<layer>`` and slots ``<layer>/<slot>``, each without the dummy row.

    Returns:
      The built ``TPUEmbeddingForServing``, its variables assigned.
    """
    configs = {}
    for layer in self.tables:
      table = _API.TableConfig(vocabulary_size=layer.vocabulary_size, dim=layer.output_dim,
                               combiner="sum", name=layer.name)
      configs[layer.name] = _API.FeatureConfig(table=table, name=layer.name)
    serving = _API.TPUEmbeddingForServing(configs, self.engine_optimizer)
    serving.build()
    for layer in self.tables:
      trained = self.engine.slots(layer.name)
      for slot, variable in serving._variables[layer.name].items():
        variable.assign(trained[slot][:layer.vocabulary_size])
    return serving


def _initial_rows(layer) -> Callable:
  """The engine table's initial value: the layer's current rows and a zero dummy row.

  Sharding-aware: on a slice of several hosts the API's sharded variable
  creator (``make_sharded_variable_creator``) makes one variable per host and
  calls the initializer with that shard's ``shard_info`` (its shape and its
  first row's offset); each shard then gets rows ``[offset, offset + rows)`` of
  the ``V + 1``-row table, and only those are read from the layer.
  """
  rows, width = layer.vocabulary_size + 1, layer.output_dim

  def initializer(shape, dtype=tf.float32, shard_info=None):
    start, count = (0, rows) if shard_info is None else (shard_info.offset[0],
                                                          shard_info.shape[0])
    asked = tuple(shape) if shard_info is None else tuple(shard_info.shape)
    if asked[1:] != (width,) or count != asked[0] or not 0 <= start <= start + count <= rows:
      raise ValueError(f"the engine table of {layer.name} has {rows} x {width} rows (its "
                       f"{layer.vocabulary_size} and a dummy row); asked for {asked} at row "
                       f"{start}")
    stop = min(start + count, layer.vocabulary_size)
    values = tf.cast(layer.embeddings[start:stop], dtype)
    dummy = tf.zeros([start + count - max(stop, start), width], dtype)  # the dummy row, if here
    return tf.concat([values, dummy], 0)
  return initializer
