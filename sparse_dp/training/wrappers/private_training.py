"""``PrivateTraining``: one model's DP run (noise, accountant, sampler, state), which
``make_private`` returns and the DP step, the fit wrappers and the host guards read."""

from __future__ import annotations

import dataclasses
import itertools
import math
import secrets
import weakref
from typing import Optional

import tensorflow as tf

from sparse_dp import optimizers
from sparse_dp.accounting import (
  BatchSchedule,
  PrivacyAccountant,
  PrivacyReport,
  PrivacySpec,
  steps_for_epochs,
)
from sparse_dp.accounting.report import epsilon_caveat
from sparse_dp.distribute import parameter_servers, workers
from sparse_dp.layers import embedding_backends
from sparse_dp.layers.embedding import Embedding
from sparse_dp.training.checks import validation
from sparse_dp.training.config import DPConfig
from sparse_dp.training.dp_state.state import DPState, Run
from sparse_dp.training.dp_state.weight_fingerprint import Fingerprint, WeightsMovedOutsideDPError
from sparse_dp.training.dp_step.losses import per_example_loss_fn
from sparse_dp.training.dp_step.run_statistics import RunStatistics
from sparse_dp.training.dp_step.step import StepNoise
from sparse_dp.training.poisson.poisson_sampling import (
  PoissonSample,
  batch_capacity,
  derives_from,
  examples_in_batch,
  poisson_passes,
  transformations_from,
)
from sparse_dp.training.wrappers.callbacks import PrivacyCallback


class PrivateTraining:
  """The DP state of one model: its noise, its accountant, its sampler.

  Made by :func:`make_private`. Query ``epsilon()`` at any time, pass ``callback()`` to
  ``fit``, and feed ``poisson_dataset(...)`` for a proved guarantee. The counters and the
  record of runs live on the model (``model.dp_state``,
  :mod:`sparse_dp.training.dp_state.state`), so checkpoints carry them. The secret seed
  lives here only: from ``config.noise_seed``, else from the operating system.

  Args:
    model (keras.Model): the private Keras model.
    config: the run's algorithm, clipping norms, noise and budget.
    num_examples: ``N``, the number of training examples.
    batch_size: the expected batch size ``B``; the sampling rate is ``q = B / N``.
    spec: the run's algorithm, noise and schedule; ``None`` for ``algorithm="none"``.
    state: the model's DP state (:func:`~sparse_dp.training.dp_state.state.attach`).
    leaves: the layers the DP step trains (``Dense`` and ``Embedding`` layers).
    resumed: whether the run resumes a saved one; a job that goes on with the saved
      run's mechanism is not charged its top-k preselection again.
    max_batch_size: batches are truncated to this many examples, accounted as such.
    statistics_epsilon: pure-DP epsilon of the preprocessing statistics, spent once at
      the start of the run.
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
    # The fixed loss scale of mixed_float16 (:mod:`~sparse_dp.training.dp_step.mixed_precision`).
    self.loss_scale = 1.0
    # The noise and the sample must be unpredictable: without a seed from the
    # user, one from the OS's cryptographic source. Never saved in the state.
    # Under a multi-worker strategy every worker takes worker 0's seed.
    self.seed = workers.chiefs_value(
        model.distribute_strategy,
        config.noise_seed if config.noise_seed is not None else secrets.randbits(62))
    self.epsilon_budget = epsilon_budget(config)
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
      self.run_statistics = RunStatistics(sum(layer.vocabulary_size for layer in leaves
                                              if isinstance(layer, Embedding)))
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
    """The most examples one step's batch holds (a TPU engine's static bound).

    ``max_batch_size``, else the capacity of a padded Poisson batch
    (:func:`~sparse_dp.training.poisson.poisson_sampling.batch_capacity`). That capacity
    bounds an unpadded batch too, and any replica's slice of it.
    """
    return self.max_batch_size or batch_capacity(self.num_examples, self.sampling_rate)

  @property
  def is_private(self) -> bool:
    """Whether the run is DP: any algorithm but ``none``."""
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
    """Epsilon at ``delta`` after the steps taken so far, or after ``steps`` in all.

    The accountant composes every run on the model. An epsilon of non-Poisson batches is
    not proved (``poisson_sampling``); print it with :meth:`epsilon_text`, which adds the
    caveat (:func:`~sparse_dp.accounting.report.epsilon_caveat`).

    Args:
      steps: steps in all to account; those beyond the steps taken are at this run's
        noise and sampling rate. Default: the steps taken.
      delta: the target delta; default: the run's (``DPConfig.delta``, else ``1 / N``).

    Returns:
      The epsilon spent (or that ``steps`` would spend); ``inf`` without DP.

    Raises:
      WeightsMovedOutsideDPError: with ``steps=None``, the weights moved outside the DP
        step (:meth:`check_weights`).
      ValueError: ``delta`` is not in ``(0, 1)``.
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
    """``epsilon`` to print, with the not-Poisson caveat in the same line.

    Args:
      epsilon: an epsilon of this model, e.g. from :meth:`epsilon`.

    Returns:
      The epsilon to 4 significant digits, followed by "NOT a proved epsilon" unless
        every step so far was fed the package's Poisson batches.
    """
    return f"{epsilon:.4g}{epsilon_caveat(self.poisson_sampling)}"

  def max_steps_within_budget(self) -> Optional[int]:
    """Most steps in all whose epsilon stays within ``epsilon_budget``.

    Returns:
      The most steps, counting those taken (the steps taken if they already exceed the
        budget); ``None`` without a budget or without DP.
    """
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
    """Routes the tables through ``backend`` (:func:`make_private` calls it).

    The engine's tables and optimizer slots (``backend.checkpointable``) are saved and
    restored with the model's DP state (``dp_state/embedding_engine``). A resumed run
    thus keeps the engine's Adam moments.

    Args:
      backend: where the tables live and how the step's update reaches them.
    """
    self.embedding_backend = backend
    backend.attach()
    if backend.checkpointable is not None:
      self.state.embedding_engine = backend.checkpointable
    self.track_weights()  # the engine's tables are left out of the fingerprint

  def create_optimizer_weights(self) -> None:
    """Creates the optimizer's slots before a train function is traced.

    The slots are those of the variables the DP step updates through the optimizer
    (:func:`sparse_dp.optimizers.create_weights`). Made in the first trace, they would
    make ``fit`` trace its step twice. A model not built yet gets none here: its first
    trace makes them.
    """
    if self.model.built:
      with self.model.distribute_strategy.scope():
        optimizers.create_weights(self.model.optimizer, self.embedding_backend.optimizer_variables(
            self.model.trainable_variables))

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
    """Refuses weights that moved outside the DP step.

    The fingerprint (:mod:`~sparse_dp.training.dp_state.weight_fingerprint`) is
    recomputed from the weights, in ``O(parameters)``.

    Raises:
      WeightsMovedOutsideDPError: the weights changed outside the DP step (another
        model's ``fit``, a shared layer, a custom loop's optimizer, an assign).
    """
    if self.fingerprint is not None and self.fingerprint.moved():
      raise WeightsMovedOutsideDPError(
          f"sparse-dp: the weights of private model '{self.model.name}' changed outside its "
          "DP steps (another model's fit on a model that contains it, a layer shared with a "
          "model trained without DP, an optimizer applied in a custom loop, an assign): no "
          "epsilon covers them, so none is given. Train the private model only through its "
          "own fit, train_on_batch or train_step; restore saved weights with load_weights "
          "or set_weights")

  def report(self) -> PrivacyReport:
    """The privacy report of every step the model has taken.

    Returns:
      This run's :class:`~sparse_dp.accounting.PrivacyReport`, with the steps and
        selections of earlier runs on the model composed into its epsilon.

    Raises:
      WeightsMovedOutsideDPError: the weights moved outside the DP step.
    """
    self.check_weights()
    accountant = self.accountant
    spec = dataclasses.replace(self.spec, schedule=BatchSchedule.constant(
        self.sampling_rate, accountant.steps - self.run.first_step))
    return PrivacyReport.compute(
        spec, self.delta, num_examples=self.num_examples, ledger=accountant,
        poisson_sampling=self.poisson_sampling,
        debug_metrics=any(run.debug_metrics for run in self.state.runs))

  def poisson_sample(self, data) -> PoissonSample:
    """The Poisson sampler of ``data``'s rows at this run's rate ``q``.

    Each step's batch is keyed by its step, as
    :class:`~sparse_dp.distribute.ParameterServerTraining` draws it.

    Args:
      data (nest of arrays or tensors): every example, as arrays, ragged or sparse
        tensors.

    Returns:
      A sampler: called with a stateless seed, it returns one Poisson batch of ``data``.
    """
    return PoissonSample(data, self.sampling_rate)

  def poisson_dataset(self, x, y=None, sample_weight=None, epochs: float = 1.0,
                      padded: Optional[bool] = None) -> tf.data.Dataset:
    """Poisson-sampled batches of in-memory ``(x, y, sample_weight)`` for ``epochs``.

    The batches are fresh on every pass (Keras ``epochs=``) and every call. Feed the
    dataset to ``fit`` as it is: ``prefetch``, ``take`` and ``repeat`` are fine. Behind a
    ``map`` or any other transformation its steps count as not Poisson. Transform the
    examples before sampling instead, each from that example alone:
    ``poisson_dataset(f(x), y)`` (manual: *What the epsilon covers*).

    Args:
      x (nest of arrays or tensors): the features of all ``num_examples`` examples: any
        nest of arrays, pandas columns, ragged or sparse tensors.
      y (nest of arrays or tensors): their labels, or ``None``.
      sample_weight (array or tensor): their weights, or ``None``; needs ``y``.
      epochs: expected visits of each example in one pass of the dataset, which has
        ``ceil(epochs / q)`` batches.
      padded: pad every batch to one static size, with its example mask, for steps
        compiled with XLA. Default: when the model is private and has ``jit_compile``.

    Returns:
      The batches: ``x``, ``(x, y)`` or ``(x, y, sample_weight)`` each.

    Raises:
      ValueError: the data does not hold exactly ``num_examples`` rows (``q`` and
        ``delta`` are computed from it); ``sample_weight`` comes without ``y``; or
        ``padded=True`` without DP.
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

    Only for a sampler that makes each batch an independent Poisson sample of all
    ``num_examples`` examples, truncated to ``max_batch_size``, and feeds each batch at
    most once (:meth:`sparse_dp.jobs.sample.SampledBatches.dataset`).

    Args:
      dataset: the presampled batches.
      num_examples: ``N`` the batches were sampled from.
      sampling_rate: ``q`` they were sampled with.
      max_batch_size: the size they were truncated to; ``None``: not truncated.

    Returns:
      ``dataset`` itself, now recognised by ``fit`` as Poisson batches.

    Raises:
      ValueError: the sample's ``N``, ``q`` or truncation is not the one this run
        accounts.
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

    Args:
      x (tf.data.Dataset): the input ``fit`` is given.

    Returns:
      The names of the transformations that do not pass each batch through unchanged,
        in the order applied (``["unbatch", "batch"]``); ``None`` when ``x`` is not built
        on one of these datasets (see :func:`transformations_from`).
    """
    return transformations_from(x, self._live_datasets())

  def feeds_poisson(self, x) -> bool:
    """Whether ``x`` is one of this object's Poisson datasets, behind batch-preserving steps.

    Args:
      x (tf.data.Dataset): the input ``fit`` is given.

    Returns:
      True when ``x`` is such a dataset behind ``prefetch``, ``take``, ``repeat`` or
        options only.
    """
    return derives_from(x, self._live_datasets())

  def next_batch_fingerprint(self, x) -> int:
    """A fingerprint of the first batch ``fit(x)`` will draw.

    Args:
      x (tf.data.Dataset): the input ``fit`` is given.

    Returns:
      The 64-bit fingerprint (:meth:`.PoissonPasses.next_batch_fingerprint`) if ``x`` is
        one of this object's Poisson datasets; else 0.
    """
    for dataset, passes in list(self._poisson_datasets.items()):
      if passes is not None and derives_from(x, [dataset]):
        return passes.next_batch_fingerprint()
    return 0

  def _live_datasets(self) -> list[tf.data.Dataset]:
    return list(self._poisson_datasets)

  def callback(self, log_every_steps: int = 50):
    """The Keras callback that logs ``epsilon`` and stops training at the budget.

    Args:
      log_every_steps: batch logs carry the exact epsilon at the next multiple of this
        many steps, an upper bound.

    Returns:
      (PrivacyCallback): a :class:`PrivacyCallback` of this run, for ``fit(callbacks=...)``.
    """
    return PrivacyCallback(self, log_every_steps)

  @property
  def separability_checked(self) -> bool:
    """Whether the separability probe has passed (or the run needs none)."""
    return self._separable

  def require_probe(self) -> None:
    """Probes the next batch again (after ``compile`` changed the loss)."""
    self._separable = not self.is_private

  def check_separable(self, batch) -> bool:
    """The separability probe on ``batch``, once per run.

    See :func:`~sparse_dp.training.checks.validation.check_separable`.

    Args:
      batch (tuple or dict): a batch ``fit`` is about to train on (padded or not).

    Returns:
      Whether the probe has passed; ``False`` while no batch of 2 or more examples has
        been probed.

    Raises:
      ModelValidationError: one example's loss depends on another example.
    """
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


def epsilon_budget(config: DPConfig) -> Optional[float]:
  """The epsilon training must stop at: ``epsilon_budget``, else ``target_epsilon``, else none."""
  return config.epsilon_budget if config.epsilon_budget is not None else config.target_epsilon
