"""``make_private``: the one entry point that makes a compiled Keras model DP."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import secrets
import types
import weakref
from typing import Optional, Sequence

import tensorflow as tf

from sparse_dp._keras import keras, require_keras2_model
from sparse_dp.accounting import (BatchSchedule, PrivacyAccountant, PrivacyReport,
                                  PrivacySpec, Truncation, calibrate, steps_for_epochs)
from sparse_dp.accounting.report import epsilon_caveat
from sparse_dp.distribute import parameter_servers, workers
from sparse_dp.layers import embedding_backends
from sparse_dp.layers.embedding import Embedding
from sparse_dp.mechanisms import false_positive_probability
from sparse_dp.optimizers import sparse_optimizer
from sparse_dp.training import (dense_layers, fit_wrappers, mixed_precision, update_guard,
                                validation)
from sparse_dp.training.config import DPConfig, warn_if_threshold_densifies
from sparse_dp.training.dp_train_step import dp_train_step
from sparse_dp.training.input_ids import functional_input_ids, ids_per_example
from sparse_dp.training.losses import per_example_loss_fn
from sparse_dp.training.penalties import penalty_of
from sparse_dp.training.run_statistics import RunStatistics
from sparse_dp.training.sampling import (batch_capacity, derives_from, examples_in_batch,
                                        largest_plausible_batch, poisson_passes,
                                        transformations_from)
from sparse_dp.training.state import DPState, Run, attach
from sparse_dp.training.step import StepNoise
from sparse_dp.training.weight_fingerprint import Fingerprint, WeightsMovedOutsideDPError

_LOG = logging.getLogger(__name__)


class PrivateTraining:
  """The DP state of one model: its noise, its accountant, its sampler.

  Made by :func:`make_private`; query ``epsilon()`` at any time, pass
  ``callback()`` to ``fit``, and feed ``poisson_dataset(...)`` for a proved
  guarantee. The counters and the record of runs live on the model
  (``model.dp_state``, :mod:`sparse_dp.training.state`), so checkpoints carry
  them; the secret seed lives here only.
  """

  def __init__(self, model, config: DPConfig, num_examples: int, batch_size: float,
               spec: Optional[PrivacySpec], state: Optional[DPState] = None,
               leaves: Optional[list] = None, resumed: bool = False,
               max_batch_size: Optional[int] = None, statistics_epsilon: float = 0.0):
    self.model = model
    self.config = config
    self.num_examples = num_examples
    self.batch_size = batch_size
    self.sampling_rate = batch_size / num_examples
    self.max_batch_size = max_batch_size  # batches truncated to it, accounted as such
    self.delta = config.delta if config.delta is not None else 1.0 / num_examples
    self.spec = spec
    self.state = state
    self.leaves = leaves
    # Where the tables live and how the step's update reaches them (make_private sets it).
    self.embedding_backend: embedding_backends.EmbeddingBackend = embedding_backends.CpuBackend([])
    # The backend --embedding resolved to, and why (make_private sets it); "tpu": the
    # tables train in the V1 engine through TPUTrainer, and fit is refused.
    self.embedding_choice = embedding_backends.BackendChoice("cpu", "requested")
    self.step_noise: Optional[StepNoise] = None  # the DP step's noise (make_private sets it)
    # The fixed loss scale of mixed_float16 (:mod:`~sparse_dp.training.mixed_precision`).
    self.loss_scale = 1.0
    # The noise and the sample must be unpredictable: without a seed from the
    # user, one from the OS's cryptographic source. Never saved in the state.
    # Under a multi-worker strategy every worker takes worker 0's seed.
    self.seed = workers.chiefs_value(
        model.distribute_strategy,
        config.noise_seed if config.noise_seed is not None else secrets.randbits(62))
    self.epsilon_budget = _epsilon_budget(config)
    self.feeding_poisson = False  # whether the fit running now is fed our Poisson batches
    # Each Poisson dataset made here (alive), with its passes (None: presampled batches).
    self._poisson_datasets: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    self._streams = itertools.count()
    self._separable = spec is None  # nothing to probe without DP
    self._accountant: tuple = (None, None)
    self.fingerprint: Optional[Fingerprint] = None  # set by make_private
    if spec is None:
      return
    self.run = Run(config.algorithm, spec.training_noise_multiplier, self.sampling_rate,
                   first_step=int(state.steps_taken.numpy()), num_examples=num_examples,
                   delta=self.delta, selection_epsilon=spec.selection_epsilon,
                   statistics_epsilon=statistics_epsilon,
                   epsilon_budget=self.epsilon_budget, debug_metrics=config.debug_metrics,
                   max_batch_size=max_batch_size)
    earlier = state.runs
    if resumed and earlier and earlier[-1].continued_by(self.run):
      # The saved job goes on with the same preselection: its spend is not repeated.
      self.run = dataclasses.replace(self.run, selection_epsilon=0.0)
    state.begin_run(self.run)
    with model.distribute_strategy.scope():
      flag = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_WRITE,
                  aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      # -1: no limit. Read by the step, which refuses to run past it.
      self.step_limit = tf.Variable(-1, dtype=tf.int64, name="dp_step_limit", **flag)
      # Set by the installed ``fit`` while it is fed this object's Poisson batches.
      self.poisson_input = tf.Variable(False, name="dp_poisson_input", **flag)
      # Steps this object has drawn noise for: never saved nor restored, so a
      # rollback to an earlier checkpoint (steps_taken goes back) never redraws
      # noise already used, which would let two updates subtract it.
      self.noise_draws = tf.Variable(0, dtype=tf.int64, name="dp_noise_draws", **flag)
      self.run_statistics = RunStatistics(sum(l.vocabulary_size for l in leaves
                                              if isinstance(l, Embedding)))
    self._update_step_limit()

  @property
  def steps_taken(self) -> tf.Variable:
    """DP steps the model has taken, over all its runs (a variable the step counts)."""
    return self.state.steps_taken

  @property
  def accountant(self) -> PrivacyAccountant:
    """The accountant of every run on the model, up to the steps taken."""
    self.sync_with_state()
    key = (self.state.runs_json.numpy(), int(self.state.steps_taken.numpy()))
    if self._accountant[0] != key:
      self._accountant = (key, self.state.accountant())
    return self._accountant[1]

  @property
  def largest_batch(self) -> int:
    """The most examples one step's batch holds: ``max_batch_size``, else the capacity of a
    padded Poisson batch (:func:`~sparse_dp.training.sampling.batch_capacity`), which bounds
    an unpadded one too and any replica's slice of it (a TPU engine's static bound)."""
    return self.max_batch_size or batch_capacity(self.num_examples, self.sampling_rate)

  @property
  def is_private(self) -> bool:
    return self.spec is not None

  @property
  def poisson_sampling(self) -> bool:
    """Whether every step the model took was fed the package's Poisson batches."""
    return self.is_private and self.state.all_poisson

  @property
  def step_noise_multiplier(self) -> float:
    """The one Gaussian a training step amounts to, for the accountant."""
    return self.spec.training_noise_multiplier

  def epsilon(self, steps: Optional[int] = None, delta: Optional[float] = None) -> float:
    """Epsilon at ``delta`` (default: the run's) after the steps taken so far.

    With ``steps``: after ``steps`` in all, the further ones at this run's noise
    and sampling rate. An epsilon of non-Poisson batches is not proved
    (``poisson_sampling``); print it with :func:`epsilon_caveat`. The epsilon
    spent (``steps=None``) is refused once the weights moved outside the DP
    step (:meth:`check_weights`).
    """
    if not self.is_private:
      return math.inf
    delta = self.delta if delta is None else delta
    accountant = self.accountant
    if steps is None:
      self.check_weights()
      return accountant.get_epsilon(delta)
    return accountant.epsilon_after(delta, self.step_noise_multiplier, self.sampling_rate,
                                    steps - accountant.steps, self.run.truncation)

  def epsilon_text(self, epsilon: float) -> str:
    """``epsilon`` to print, with the not-Poisson caveat in the same line."""
    return f"{epsilon:.4g}{epsilon_caveat(self.poisson_sampling)}"

  def max_steps_within_budget(self) -> Optional[int]:
    """Most steps in all whose epsilon stays within ``epsilon_budget``."""
    if self.epsilon_budget is None or not self.is_private:
      return None
    low = self.accountant.steps
    high = max(2 * low, 1)
    if self.epsilon(low) > self.epsilon_budget:
      return low
    while self.epsilon(high) <= self.epsilon_budget:
      low, high = high, 2 * high
    while high - low > 1:
      middle = (low + high) // 2
      low, high = (middle, high) if self.epsilon(middle) <= self.epsilon_budget else (low, middle)
    return low

  def use_embedding_backend(self, backend: embedding_backends.EmbeddingBackend) -> None:
    """Routes the tables through ``backend``; its engine's tables and optimizer slots
    (``backend.checkpointable``) are saved and restored with the model's DP state
    (``dp_state/embedding_engine``), so a resumed run keeps the engine's Adam moments."""
    self.embedding_backend = backend
    backend.attach()
    if backend.checkpointable is not None:
      self.state.embedding_engine = backend.checkpointable
    self.track_weights()  # the engine's tables are left out of the fingerprint

  def track_weights(self) -> None:
    """(Re)starts the fingerprint of the weights the DP step updates through Keras.

    Called by ``make_private`` and whenever the embedding backend changes.
    Left out: tables held by an embedding engine (synced to Keras outside the
    step), and the tables of a dense-noise algorithm (DP-SGD, DP-FEST), whose
    every row each step updates: keeping their fingerprint would read the
    whole table twice a step (it tripled DP-SGD's step at 1e6 rows). Under
    ``ParameterServerStrategy`` (weights on remote servers, steps scheduled
    asynchronously) no fingerprint is kept.
    """
    if parameter_servers.is_parameter_server(self.model.distribute_strategy):
      self.fingerprint = None
      return
    engine = not isinstance(self.embedding_backend, embedding_backends.CpuBackend)
    left_out = {id(layer.embeddings) for layer in self.leaves if isinstance(layer, Embedding)
                and (engine or not self.step_noise.sparse)}
    variables = [v for v in self.model.trainable_variables if id(v) not in left_out]
    self.fingerprint = Fingerprint(variables, self.state.weight_fingerprint)
    self.fingerprint.reset()

  def check_weights(self) -> None:
    """Refuses weights that moved outside the DP step (:mod:`.weight_fingerprint`)."""
    if self.fingerprint is not None and self.fingerprint.moved():
      raise WeightsMovedOutsideDPError(
          f"sparse-dp: the weights of private model '{self.model.name}' changed outside its "
          "DP steps (another model's fit on a model that contains it, a layer shared with a "
          "model trained without DP, an optimizer applied in a custom loop, an assign): no "
          "epsilon covers them, so none is given. Train the private model only through its "
          "own fit, train_on_batch or train_step; restore saved weights with load_weights "
          "or set_weights")

  def report(self) -> PrivacyReport:
    """The privacy report of every step the model has taken."""
    self.check_weights()
    accountant = self.accountant
    spec = dataclasses.replace(self.spec, schedule=BatchSchedule.constant(
        self.sampling_rate, accountant.steps - self.run.first_step))
    return PrivacyReport.compute(
        spec, self.delta, num_examples=self.num_examples, ledger=accountant,
        poisson_sampling=self.poisson_sampling,
        debug_metrics=any(run.debug_metrics for run in self.state.runs))

  def poisson_dataset(self, x, y=None, sample_weight=None, epochs: float = 1.0,
                      padded: Optional[bool] = None) -> tf.data.Dataset:
    """Poisson-sampled batches of in-memory ``(x, y, sample_weight)`` for ``epochs``.

    Any nest of arrays, pandas columns, ragged or sparse tensors holding all
    ``num_examples`` examples (other data is refused: ``q`` and ``delta`` are
    computed from ``num_examples``); fresh batches on every pass (Keras
    ``epochs=``) and every call. Feed it to ``fit`` as it is (``prefetch``,
    ``take``, ``repeat`` are fine): behind a ``map`` or any other
    transformation its steps count as not Poisson. Transform the examples
    before sampling instead: ``poisson_dataset(f(x), y)``, with ``f``
    computing each example from that example alone (a statistic of the
    dataset, such as a target encoding or a scale by the data's maximum, is
    released through the model outside the epsilon unless it is public).
    """
    if sample_weight is not None and y is None:
      raise ValueError("poisson_dataset: sample_weight needs labels y (pass y=...); "
                       "a model without labels takes its weights inside x")
    data = tuple(t for t in (x, y, sample_weight) if t is not None)
    stream = (int(self.state.datasets_made.assign_add(1).numpy()) if self.is_private
              else next(self._streams))
    if padded is None:
      padded = self.is_private and bool(getattr(self.model, "_jit_compile", False))
    if padded and not self.is_private:
      raise ValueError("poisson_dataset(padded=True): algorithm 'none' trains with Keras's own "
                       "train_step, which has no example mask; pass padded=False")
    passes = poisson_passes(data if len(data) > 1 else data[0], self.sampling_rate,
                            steps_for_epochs(epochs, self.sampling_rate), self.seed, stream,
                            num_examples=self.num_examples,
                            capacity=(batch_capacity(self.num_examples, self.sampling_rate)
                                      if padded else None))
    dataset = passes.dataset()
    self._poisson_datasets[dataset] = passes
    return dataset

  def presampled_dataset(self, dataset: tf.data.Dataset, num_examples: int,
                         sampling_rate: float, max_batch_size: Optional[int]) -> tf.data.Dataset:
    """``dataset``, whose ``fit`` steps count as Poisson: batches sampled before training.

    Only for a sampler that makes each batch an independent Poisson sample of
    rate ``sampling_rate`` of all ``num_examples`` examples, truncated to
    ``max_batch_size``, and feeds each batch at most once
    (:meth:`sparse_dp.sampling.SampledBatches.dataset`); a sample of another
    ``N``, ``q`` or truncation than this run accounts is refused.
    """
    sample = (num_examples, sampling_rate, max_batch_size)
    if sample != (self.num_examples, self.sampling_rate, self.max_batch_size):
      raise ValueError(
          f"the batches were sampled with (N, q, max batch size) = {sample}, but this run "
          f"accounts {(self.num_examples, self.sampling_rate, self.max_batch_size)}: pass "
          "make_private the sample's num_examples, batch_size and max_batch_size")
    self._poisson_datasets[dataset] = None
    return dataset

  def transformations_to(self, x) -> Optional[list[str]]:
    """The ``tf.data`` transformations from one of this object's Poisson datasets to ``x``.

    ``None`` when ``x`` is not built on one (see :func:`transformations_from`).
    """
    return transformations_from(x, self._live_datasets())

  def feeds_poisson(self, x) -> bool:
    """Whether ``x`` is one of this object's Poisson datasets, behind batch-preserving steps."""
    return derives_from(x, self._live_datasets())

  def next_batch_fingerprint(self, x) -> int:
    """A fingerprint of the first batch ``fit(x)`` will draw, if ``x`` is one of this object's
    Poisson datasets (:meth:`.PoissonPasses.next_batch_fingerprint`); else 0."""
    for dataset, passes in list(self._poisson_datasets.items()):
      if passes is not None and derives_from(x, [dataset]):
        return passes.next_batch_fingerprint()
    return 0

  def _live_datasets(self) -> list[tf.data.Dataset]:
    return list(self._poisson_datasets)

  def callback(self, log_every_steps: int = 50):
    from sparse_dp.training.callbacks import PrivacyCallback  # pylint: disable=import-outside-toplevel
    return PrivacyCallback(self, log_every_steps)

  @property
  def separability_checked(self) -> bool:
    return self._separable

  def require_probe(self) -> None:
    """Probes the next batch again (after ``compile`` changed the loss)."""
    self._separable = not self.is_private

  def check_separable(self, batch) -> bool:
    """The separability probe on ``batch``, once per run (see :mod:`.validation`)."""
    if not self._separable:
      self._separable = validation.check_separable(self.model, self.leaves,
                                                   per_example_loss_fn(self.model),
                                                   examples_in_batch(batch))
    return self._separable

  def sync_with_state(self) -> None:
    """Re-records this run if restored weights replaced the state that held it.

    After ``model.load_weights`` following ``make_private``, the restored
    state may lack this run or end with another one: this run is recorded
    (again) from the restored step, so the steps it takes next are its own, and
    its step limit is derived anew from the budget and every recorded run.
    """
    self.state.absorb_layers()  # weights restored by any format bring their record
    runs = self.state.runs
    if runs and runs[-1].run_id == self.run.run_id:
      return
    self.run = dataclasses.replace(self.run, first_step=int(self.state.steps_taken.numpy()))
    self.state.begin_run(self.run)
    self._update_step_limit()

  def _update_step_limit(self) -> None:
    limit = self.max_steps_within_budget()
    self.step_limit.assign(-1 if limit is None else limit)


def make_private(model: keras.Model, config: DPConfig, *, num_examples: int,
                 batch_size: float, epochs: Optional[float] = None,
                 resume_from: Optional[str] = None, embedding: str = "auto",
                 max_batch_size: Optional[int] = None,
                 public_layers: Sequence[str] = (),
                 private_statistics: Sequence = ()) -> PrivateTraining:
  """Makes ``model.fit`` train with ``config``'s DP algorithm.

  Call after ``model.compile``, on a built model. Refuses models that DP
  clipping cannot cover (:func:`validation.check_model`; the first batch of
  the first ``fit`` is probed by :func:`validation.check_separable`).
  Installs a DP ``train_step`` on ``model`` (a functional model, a
  ``keras.Model`` subclass or a ``tfrs.Model``), and ``fit``,
  ``train_on_batch`` and ``compile`` wrappers (:mod:`.fit_wrappers`): ``fit``
  knows whether it is fed this object's ``poisson_dataset`` and refuses
  un-noised validation logs; a later ``compile`` keeps the model private. With
  an epsilon budget, ``steps_per_execution`` must be 1. Replaces its optimizer
  by one whose table updates stay sparse
  (:func:`sparse_dp.optimizers.sparse_optimizer`), and returns the
  :class:`PrivateTraining` holding the accountant. ``batch_size`` is the
  expected batch size: the noisy sum is divided by it and ``q = B / N``.
  ``epochs`` is needed only to calibrate ``config.target_epsilon``.

  **The budget lasts.** The model carries its DP state (``model.dp_state``):
  a second ``make_private`` on it, or on a model whose weights were restored
  from a checkpoint saved after ``make_private``, *continues* the accounting:
  epsilon composes every earlier run's steps and selection with this run's,
  and ``epsilon_budget`` bounds that total. ``resume_from`` (a TF-format
  checkpoint prefix, a checkpoint folder or a SavedModel folder) restores the
  DP state saved there into the model first; restore the weights and the
  optimizer as usual (``model.load_weights``, ``tf.train.Checkpoint.restore``).
  The secret noise seed is never saved: a resumed run draws a fresh one unless
  ``config.noise_seed`` is fixed. A run resumed with the saved run's algorithm,
  noise, sampling rate and ``selection_epsilon`` is that job going on: its
  top-k preselection (DP-FEST, DP-AdaFEST+) is charged once. Any other run
  charges its ``selection_epsilon`` as a new selection.

  ``embedding`` (``"auto"``, ``"tpu"``, ``"cpu"``, ``"engine-double"``) picks
  where the tables live by the strategy's hardware
  (:func:`sparse_dp.layers.embedding_backends.choose_backend`;
  ``training.embedding_choice`` says which and why, ``auto``'s is logged):
  ``tpu`` is the V1 TPU embedding engine, trained by
  :class:`sparse_dp.training.tpu_loop.TPUTrainer` (``fit`` is refused), or on
  SparseCore (V2) hardware ``TPUEmbeddingV2``, updated inside the step ``fit``
  runs (:class:`~sparse_dp.layers.embedding_backends.SparseCoreBackend`);
  ``cpu`` is the Keras variables; ``engine-double`` (off TPU, for tests)
  routes the DP step's update through the engine's pure-TF double. The DP
  semantics are the same on all.

  ``max_batch_size``: the batches are truncated Poisson samples of at most
  that many examples (``sparse-dp sample --max-batch-size``), accounted as
  such (:class:`sparse_dp.accounting.Truncation`).

  ``private_statistics``: the :class:`sparse_dp.preprocessing.PrivateStatistic`
  objects of the model's preprocessing layers (DP mean and variance, quantiles,
  vocabulary): their layers are accepted and their epsilons spent once at the
  start of this run, composed with its steps.

  ``public_layers``: names of preprocessing layers (``Normalization``,
  ``Discretization``, ``StringLookup``, ...) whose statistics come from public
  data; any other such layer is refused, since its statistics of the private
  data would be released with the model outside the epsilon
  (:mod:`sparse_dp.training.preprocessing_checks`).

  With ``algorithm="none"`` the model trains exactly as plain Keras would.
  """
  require_keras2_model(model)
  if model.optimizer is None:
    raise ValueError("compile the model (optimizer and loss) before make_private")
  if not 0 < batch_size <= num_examples:
    raise ValueError(f"batch_size must be in (0, num_examples={num_examples}], got {batch_size}")
  algorithm = config.kind
  choice = embedding_backends.choose_backend(embedding, model.distribute_strategy)
  if not algorithm.is_private:
    if embedding not in ("auto", "cpu"):
      raise ValueError(f"embedding {embedding!r} routes the DP step's update through the TPU "
                       "embedding engine; algorithm 'none' trains as plain Keras: use "
                       "embedding 'cpu'")
    if resume_from is not None:
      raise ValueError("resume_from continues a DP budget; algorithm 'none' has none")
    if choice.name != "cpu":
      choice = embedding_backends.BackendChoice("cpu", "algorithm 'none' trains as plain Keras")
  _refuse_host_tables_on_tpu_cores(model, choice)
  if embedding == "auto":
    _LOG.info("sparse-dp: %s", choice.describe(embedding))
  if not algorithm.is_private:
    training = PrivateTraining(model, config, num_examples, batch_size, spec=None)
    training.embedding_choice = choice
    return training
  _check_built(model)
  _check_train_step(model)
  statistics = {s.layer.name: s for s in private_statistics}
  validation.check_model(model, [*public_layers, *statistics])
  fit_wrappers.check_steps_per_execution(model, _epsilon_budget(config))
  leaves = dense_layers.trainable_leaf_layers(model)  # fails early on unsupported layers
  penalty = penalty_of(model)  # fails early on a penalty that reaches a table
  spec = _resolve_spec(config, num_examples, batch_size, epochs)
  if algorithm.uses_contribution_map:
    warn_if_threshold_densifies(
        [l.vocabulary_size for l in leaves if isinstance(l, Embedding)],
        config.threshold_for(spec.sigma1), spec.sigma1 * config.contribution_clip, batch_size)
  noise = StepNoise(
      gradient_multiplier=spec.sigma2 if algorithm.uses_contribution_map else spec.noise_multiplier,
      contribution_multiplier=spec.sigma1 if algorithm.uses_contribution_map else None,
      l2_norm_clip=config.l2_norm_clip, contribution_clip=config.contribution_clip,
      threshold=config.threshold_for(spec.sigma1) if algorithm.uses_contribution_map else 0.0,
      expected_batch_size=float(batch_size))
  state = attach(model)
  if resume_from is not None:
    state.restore(resume_from)
  optimizer, loss_scale = mixed_precision.split_loss_scale(model.optimizer)
  model.optimizer = update_guard.guard(sparse_optimizer(optimizer), model.name)
  if max_batch_size is not None:
    Truncation(num_examples, max_batch_size)  # refuses one the accountant cannot account
  training = PrivateTraining(model, config, num_examples, batch_size, spec, state, leaves,
                             resumed=resume_from is not None, max_batch_size=max_batch_size,
                             statistics_epsilon=sum(s.epsilon for s in statistics.values()))
  training.step_noise = noise
  training.loss_scale = loss_scale
  model.train_step = types.MethodType(dp_train_step(leaves, noise, penalty, training), model)
  if model.distribute_reduction_method == "auto":
    # The step's logs are the same on every replica (one selection, the run's statistics)
    # or replica 0's (the noise): Keras's "auto" would sum them over the replicas off TPU.
    model.distribute_reduction_method = "first"
  training.embedding_choice = choice
  tables = [l for l in leaves if isinstance(l, Embedding)]
  if choice.name == "engine-double":
    training.use_embedding_backend(embedding_backends.TPUEmbeddingBackend(
        tables, model.optimizer, _update_bounds(tables, noise, num_examples, batch_size)))
  elif choice.name == "sparsecore":
    with model.distribute_strategy.scope():
      training.use_embedding_backend(embedding_backends.SparseCoreBackend(
          tables, model.optimizer, _update_bounds(tables, noise, num_examples, batch_size),
          {layer: training.largest_batch * ids_per_example(layer) for layer in tables},
          functional_input_ids(model, tables)))
  else:
    training.track_weights()
  fit_wrappers.install(training)
  model.train_function = None
  return training


def _refuse_host_tables_on_tpu_cores(model: keras.Model,
                                     choice: embedding_backends.BackendChoice) -> None:
  """Refuses host tables (``table_placement='host'``) that TPU programs would read.

  The engines train such tables on a TPU (V1's loop ``TPUTrainer``, V2's step
  reads the engine and copies its rows to the host table when ``fit`` ends);
  with the ``cpu`` backend every step is a TPU program gathering from the table.
  """
  if (choice.name in ("tpu", "sparsecore")
      or not embedding_backends.on_tpu(model.distribute_strategy)):
    return
  on_host = [layer.name for layer in model.submodules
             if isinstance(layer, Embedding) and layer.table_placement == "host"]
  if on_host:
    raise ValueError(
        f"the tables of {', '.join(on_host)} are on the host (table_placement='host'), which "
        f"TPU programs cannot read, and embedding {choice.name!r} trains them in Keras steps "
        "on the TPU cores: build these layers with table_placement='default_device', or, on "
        "a TPU with an embedding engine (V1 or SparseCore), train them there (embedding 'tpu')")


def _update_bounds(tables: list, noise: StepNoise, num_examples: int, batch_size: float) -> dict:
  """Per table, the most rows one step selects but with probability ``<= 2e-9``.

  DP-AdaFEST selects the rows a plausible batch looks up (the largest Poisson
  batch but with probability ``1e-9``, times the ids per example of the
  layer's input, or the whole vocabulary for ragged ids) and false positives,
  ``Binomial(V, Psi(tau / (sigma1 C1)))``, bounded the same way (Bernstein).
  DP-SGD updates every row.
  """
  if not noise.sparse:
    return {layer: layer.vocabulary_size for layer in tables}
  batches = largest_plausible_batch(num_examples, batch_size / num_examples)
  false_positive = false_positive_probability(
      noise.threshold, noise.contribution_multiplier * noise.contribution_clip)
  bounds = {}
  for layer in tables:
    shape = tf.TensorShape(getattr(layer, "_build_input_shape", None))
    per_example = (math.prod(shape[1:]) if shape.rank is not None and shape[1:].is_fully_defined()
                   else layer.vocabulary_size)
    spurious = largest_plausible_batch(layer.vocabulary_size, false_positive)
    bounds[layer] = min(layer.vocabulary_size, batches * per_example + spurious)
  return bounds


def _check_built(model: keras.Model) -> None:
  """Refuses a model whose weights do not exist yet (its leaves cannot be found)."""
  layers = list(model._flatten_layers(include_self=True))  # pylint: disable=protected-access
  unbuilt = [layer.name for layer in layers
             if isinstance(layer, (keras.layers.Dense, Embedding)) and not layer.built]
  if unbuilt or not any(layer._trainable_weights for layer in layers):  # pylint: disable=protected-access
    raise ValueError(
        f"model '{model.name}' ({type(model).__name__}) is not built"
        f"{' (layers ' + ', '.join(unbuilt) + ')' if unbuilt else ''}: its weights do not "
        "exist yet, so make_private cannot find the layers to clip. Call the model on a "
        "batch first (model(x_batch), or model.compute_loss(batch) for a tfrs.Model) or give "
        "it an Input shape, then call make_private")


def _check_train_step(model: keras.Model) -> None:
  """Refuses a model class with its own ``train_step`` or Keras ``compute_loss``.

  The DP step replaces ``train_step`` and computes the compiled loss per
  example, so either override would be silently dropped. A ``tfrs.Model``'s
  ``compute_loss`` is its per-example loss, which the step uses.
  """
  own = type(model).train_step
  allowed = {keras.Model.train_step}
  try:
    import tensorflow_recommenders as tfrs  # pylint: disable=import-outside-toplevel
    allowed.add(tfrs.Model.train_step)
    tfrs_model = isinstance(model, tfrs.Model)
  except ImportError:
    tfrs_model = False
  if own not in allowed:
    raise ValueError(
        f"{type(model).__name__} defines its own train_step, which make_private would replace "
        "by the DP step, silently dropping what it does; put the per-example loss in "
        "compile(loss=...) (or compute_loss for a tfrs.Model) and keep Keras's train_step")
  keras_compute_loss = getattr(keras.Model, "compute_loss", None)
  if (not tfrs_model and keras_compute_loss is not None
      and type(model).compute_loss is not keras_compute_loss):
    raise ValueError(
        f"{type(model).__name__} overrides keras.Model.compute_loss, which the DP step does "
        "not call: it applies the compiled loss to each example alone, so the override "
        "would be silently dropped. Put the loss in compile(loss=...) as a per-example "
        "keras.losses.Loss (reduction NONE), or make the model a tfrs.Model whose "
        "compute_loss(features) returns one loss per example")


def _epsilon_budget(config: DPConfig) -> Optional[float]:
  """The epsilon training must stop at: ``epsilon_budget``, else ``target_epsilon``, else none."""
  return config.epsilon_budget if config.epsilon_budget is not None else config.target_epsilon


def _resolve_spec(config: DPConfig, num_examples, batch_size, epochs) -> PrivacySpec:
  algorithm = config.kind
  q = batch_size / num_examples
  if config.target_epsilon is None:
    return PrivacySpec(algorithm, BatchSchedule.constant(q, 0),
                       noise_multiplier=None if algorithm.uses_contribution_map else config.noise_multiplier,
                       sigma1=config.sigma1 if algorithm.uses_contribution_map else None,
                       sigma2=config.sigma2 if algorithm.uses_contribution_map else None,
                       selection_epsilon=config.selection_epsilon)
  if epochs is None:
    raise ValueError("target_epsilon needs epochs= to know how many steps to calibrate for")
  delta = config.delta if config.delta is not None else 1.0 / num_examples
  return calibrate(algorithm, config.target_epsilon, delta,
                   BatchSchedule.constant(q, steps_for_epochs(epochs, q)),
                   sigma_ratio=config.sigma_ratio, selection_epsilon=config.selection_epsilon)
