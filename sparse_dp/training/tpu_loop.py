"""DP training through the TPU embedding API: a loop of two TPU programs per step.

Keras ``fit`` runs a DP step as one TPU program, which the V1 TPU embedding API cannot serve
(:mod:`sparse_dp.layers.embedding_backends.live_engine`). :class:`TPUTrainer` runs step ``t``
of batch ``B_t`` (Ghazi et al., NeurIPS 2023, Algorithm 1) as: (1) the host enqueues every
table's ids of ``B_t`` (``training=False``); (2) program A runs the model's DP ``train_step``
(:mod:`sparse_dp.training.wrappers.dp_train_step`) and returns, per table, the selected rows
``S_t`` padded to ``M`` with the dummy row ``V`` and their activation gradients
``(sum_i [g_i]_C2 + noise) / B``; (3) the host enqueues those as ``<layer>/dp_update``
(``training=True``); (4) program B applies them, so the engine puts exactly the noisy sum on
``S_t``. With several replicas every core enqueues the same ``S_t`` with its own clipped
share and only the first adds noise. The loop only moves ids and gradients. It runs on V1
hardware only; tests pass ``api_factory=`` a
:class:`~sparse_dp.layers.embedding_backends.doubles.tpu_api_double.TPUEmbeddingAPIDouble`.
Never run on a TPU. See docs/tpu.md ("The two-program loop").
"""

from __future__ import annotations

from typing import Callable, Optional

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.layers import embedding_backends
from sparse_dp.layers.embedding import Embedding
from sparse_dp.layers.embedding_backends.two_program import TwoProgramBackend
from sparse_dp.training.dp_step.input_ids import (
  InputIds,
  functional_input_ids,
  ids_per_example,
  per_example_input_ids,
)
from sparse_dp.training.poisson import padded_batches
from sparse_dp.training.wrappers import fit_wrappers, host_guards
from sparse_dp.training.wrappers.entry_point import update_bounds
from sparse_dp.training.wrappers.private_training import PrivateTraining

# The models whose real engine this process made: TF allows one per TPU system initialisation
# (TPUEmbedding.build: "TPU is already initialized for embeddings").
_ENGINES_MADE: list = []
ONE_ENGINE_ROUTE = (
    "train each model in its own process (sparse-dp stream --strategy tpu: one period per "
    "command, --train-days of that period, the state folder resuming its ledger; sparse-dp "
    "train --strategy tpu: one algorithm per command, without --compare)")
ONE_ENGINE_PER_PROCESS = (
    "TPUTrainer: this process has made a TPU embedding engine already, and TensorFlow builds "
    "one per TPU system initialisation ('TPU is already initialized for embeddings'): "
    + ONE_ENGINE_ROUTE)


class TPUTrainer:
  """Trains a private model (``make_private``) with its tables in the TPU embedding engine.

  ``input_ids(x)``: each table's ids in a batch's features ``x``, by layer
  name (default: ``make_private``'s ``input_ids``, else, for a functional model whose tables
  are each called once on a model input, that input), run on each example alone
  (:func:`~sparse_dp.training.dp_step.input_ids.per_example_input_ids`): an example's lookups
  read only the rows of the ids it gave.
  ``api_factory(feature_config, optimizer)``: the API object; default the real
  ``TPUEmbedding``, refused but on a TPU with the V1 engine; tests pass
  :class:`~sparse_dp.layers.embedding_backends.doubles.tpu_api_double.TPUEmbeddingAPIDouble`.
  The accountant is the private model's: ``private.epsilon()`` counts every
  step this loop takes. The model's tables are the engine's host copies:
  build them with ``Embedding(..., table_placement="host")``, which on a TPU
  is required (:mod:`sparse_dp.layers.table_placement`).

  ``jit_compile`` (default: on a ``TPUStrategy``, or when the model is
  compiled with ``jit_compile=True``): programs A and B are compiled with XLA,
  as a TPU compiles every program; then the step's guards run on the host
  (:mod:`~sparse_dp.training.wrappers.host_guards`): the budget before each step, the
  size of a non-Poisson batch in its pipeline, ids outside a vocabulary and a
  false-positive overflow after it. Feed ``private.poisson_dataset(...,
  padded=True)`` so that XLA compiles program A once. Off TPU it is refused on
  several replicas (XLA compiles a ``MirroredStrategy``'s ``strategy.run`` as
  one program on one device).
  """

  def __init__(self, private: PrivateTraining, input_ids: Optional[InputIds] = None,
               api_factory: Optional[Callable] = None, sum_inside_sqrt: bool = False,
               jit_compile: Optional[bool] = None):
    if not private.is_private:
      raise ValueError("TPUTrainer trains DP steps; algorithm 'none' trains with model.fit")
    if private.config.microbatch_size is not None:
      raise ValueError("TPUTrainer: microbatch_size runs several forward passes per step, "
                       "and a TPU program holds one embedding round; drop microbatch_size")
    model = private.model
    self.private, self.model = private, model
    self.strategy = model.distribute_strategy
    if api_factory is None:  # the real engine: the hardware must have V1's
      choice = embedding_backends.choose_backend("tpu", self.strategy)
      if choice.name != "tpu":
        raise ValueError(f"TPUTrainer trains tables in the V1 TPU embedding engine; this is a "
                         f"{choice.reason}: train with model.fit")
      if _ENGINES_MADE:
        raise RuntimeError(ONE_ENGINE_PER_PROCESS)
    on_tpu = embedding_backends.on_tpu(self.strategy)
    if jit_compile is None:
      jit_compile = private.compiled_by_xla
    replicas = self.strategy.num_replicas_in_sync
    if jit_compile and replicas > 1 and not on_tpu:
      raise ValueError(
          f"TPUTrainer(jit_compile=True) on {replicas} replicas off TPU: XLA compiles the "
          "programs' strategy.run as one program on one device, which cannot reach the other "
          "replicas' variables (a TPU compiles each replica's program); pass "
          "jit_compile=False, or one replica")
    tables = [layer for layer in private.leaves if isinstance(layer, Embedding)]
    in_hbm = [table.name for table in tables if table.table_placement != "host"]
    if on_tpu and in_hbm:
      raise ValueError(
          f"TPUTrainer: the tables of {', '.join(in_hbm)} are in every core's TensorCore HBM "
          "(table_placement='default_device') beside the embedding engine's copy, which is the "
          "one that trains: build these Embedding layers with table_placement='host'")
    self.input_ids = per_example_input_ids(
        input_ids or private.input_ids or functional_input_ids(model, tables), tables)
    with self.strategy.scope():
      self.backend = TwoProgramBackend(
          tables, model.optimizer,
          update_bounds(tables, private.step_noise, private.num_examples, private.batch_size),
          {layer: private.largest_batch * ids_per_example(layer) for layer in tables}, api_factory,
          sum_inside_sqrt)
    private.use_embedding_backend(self.backend)
    self.engine = self.backend.engine
    if api_factory is None:
      _ENGINES_MADE.append(model.name)
    self.jit_compile = jit_compile or private.compiled_by_xla  # its asserts compiled away
    self._enqueue = tf.function(self._host_enqueue)
    self._enqueue_lookup = tf.function(self._host_enqueue_lookup)
    # A TPU compiles each program's replicated computation itself: no jit_compile around it.
    outer_jit = jit_compile and not on_tpu
    self._program_a = tf.function(lambda data: self.strategy.run(self._dp_step, (data,)),
                                  jit_compile=outer_jit)
    self._program_b = tf.function(
        lambda gradients: self.strategy.run(self.backend.training_update, (gradients,)),
        jit_compile=outer_jit)

  def _host_enqueue(self, features: tuple, training: bool) -> None:
    """Enqueues each replica's ``features`` (``_local(...)``) on its core (``device=``)."""
    devices = (self.strategy.extended.worker_devices if len(features) > 1
               else [None])  # one replica: the core the API enqueues on by default
    with tf.device("/cpu:0"):  # the API enqueues host tensors outside strategy.run
      for replica, device in zip(features, devices):
        self.engine.enqueue_round({n: tf.reshape(ids, [-1]) for n, ids in replica.items()},
                                  training, device=device)

  def _host_enqueue_lookup(self, features: tuple) -> None:
    """Enqueues each replica's ids of its ``features`` for the step's lookup, on the host."""
    with tf.device("/cpu:0"):
      ids = tuple(self.input_ids(x) for x in features)
    self._host_enqueue(ids, False)

  def _local(self, values) -> tuple:
    """Each replica's part of ``values`` (a nest of per-replica values), in replica order."""
    local = self.strategy.experimental_local_results
    return tuple(tf.nest.map_structure(lambda value, i=i: local(value)[i], values)
                 for i in range(self.strategy.num_replicas_in_sync))

  def _dp_step(self, data):
    x = _features(data)
    with self.backend.inference_round(self.input_ids(x)):
      stats = self.model.train_step(data)
    features, gradients = self.backend.pending
    return features, gradients, stats

  def fit(self, dataset: tf.data.Dataset, steps: Optional[int] = None) -> list:
    """Trains on ``dataset``'s batches (at most ``steps``); returns each step's DP statistics.

    Feed ``private.poisson_dataset(...)`` for a proved epsilon; any other
    input is counted as not Poisson (``private.epsilon_text`` gives the
    caveat), its batch sizes checked, as with ``fit``. Stops before a step
    the epsilon budget does not allow.
    """
    private = self.private
    private.sync_with_state()
    private.create_optimizer_weights()  # before the step's first trace
    poisson = private.feeds_poisson(dataset)
  # fit's own checks of its input, run as fit runs them
    if not poisson:
      fit_wrappers._warn_if_transformed(private.transformations_to(dataset))
    if not private.separability_checked:
      fit_wrappers._probe(private, dataset, {})
    if self.jit_compile and not poisson:
      dataset = host_guards.checked_batches(private, dataset)
    limit = int(private.step_limit.numpy())
    private.run_statistics.reset()
    private.feeding_poisson = poisson
    private.poisson_input.assign(poisson)
    history = []
    try:
      # The ids stay on the host, which enqueues them; program A gets them as its inputs.
      on_host = tf.distribute.InputOptions(experimental_fetch_to_device=False)
      for data in self.strategy.experimental_distribute_dataset(dataset, on_host):
        if len(history) == steps or 0 <= limit <= int(private.steps_taken.numpy()):
          break
        self._enqueue_lookup(tuple(_features(replica) for replica in self._local(data)))
        features, gradients, stats = self._program_a(data)
        self._enqueue(self._local(features), True)
        self._program_b(gradients)
        stats = [{name: float(value) for name, value in replica.items()}
                 for replica in self._local(stats)]
        for replica in stats:  # each replica's own examples' flags
          host_guards.refuse_compiled_step_flags(replica)
        history.append(stats[0])  # the DP statistics are the first replica's (step.py)
    finally:
      private.feeding_poisson = False
      private.poisson_input.assign(False)
      self.backend.sync_tables()
    return history


def _features(data):
  """The features ``x`` of a batch (a padded batch's, padding rows included)."""
  examples, _ = padded_batches.split(data)
  x, _, _ = keras.utils.unpack_x_y_sample_weight(examples)
  return x
