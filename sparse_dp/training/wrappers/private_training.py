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
)
from sparse_dp.accounting.report import FIXED_NOISE_SEED, NOT_POISSON, Epsilon
from sparse_dp.distribute import parameter_servers, workers
from sparse_dp.layers import embedding_backends
from sparse_dp.layers.embedding import Embedding
from sparse_dp.training.checks import validation
from sparse_dp.training.config import DPConfig
from sparse_dp.training.dp_state.provenance import fingerprinted_variables, unbound_reason
from sparse_dp.training.dp_state.state import DPState, Run
from sparse_dp.training.dp_state.weight_fingerprint import Fingerprint, WeightsMovedOutsideDPError
from sparse_dp.training.dp_step.losses import per_example_loss_fn
from sparse_dp.training.dp_step.run_statistics import RunStatistics
from sparse_dp.training.dp_step.step import StepNoise
from sparse_dp.training.poisson.poisson_sampling import examples_in_batch
from sparse_dp.training.wrappers.callbacks import PrivacyCallback
from sparse_dp.training.wrappers.poisson_inputs import PoissonInputs


class StepsRefusedError(RuntimeError):
  """The DP step refused steps that no host guard stopped: the run's epsilon is not given."""


class PrivateTraining(PoissonInputs):
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
    # Each table's ids in a batch's features, for a TPU embedding engine (make_private's
    # input_ids=); None: each table's model input (functional_input_ids).
    self.input_ids = None
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
      # Steps the step itself refused (dp_train_step: past the budget, or too large a
      # batch, when called directly under XLA): they used no data; epsilon() refuses.
      self.refused_steps = tf.Variable(0, dtype=tf.int64, name="dp_refused_steps", **flag)
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
    (:attr:`padded_capacity`). That capacity bounds an unpadded batch too, and any
    replica's slice of it.
    """
    return self.max_batch_size or self.padded_capacity

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

    The accountant composes every run on the model. The number is an
    :class:`~sparse_dp.accounting.Epsilon`: printed, it names its caveats (batches not
    Poisson-sampled, so not proved; a fixed noise seed; un-noised debug metrics).

    Args:
      steps: steps in all to account; those beyond the steps taken are at this run's
        noise and sampling rate. Default: the steps taken.
      delta: the target delta; default: the run's (``DPConfig.delta``, else ``1 / N``).

    Returns:
      The epsilon spent (or that ``steps`` would spend), with its caveats; ``inf``
        without DP.

    Raises:
      WeightsMovedOutsideDPError: with ``steps=None``, the weights moved outside the DP
        step (:meth:`check_weights`).
      StepsRefusedError: with ``steps=None``, the DP step refused steps that no host
        guard stopped (:meth:`check_no_refused_steps`).
      ValueError: ``delta`` is not in ``(0, 1)``.
    """
    if not self.is_private:
      return math.inf
    delta = self.delta if delta is None else delta
    accountant = self.accountant
    if steps is None:
      self.check_weights()
      self.check_no_refused_steps()
      return Epsilon(accountant.get_epsilon(delta), self.caveats())
    return Epsilon(accountant.epsilon_after(delta, self.step_noise_multiplier,
                                            self.sampling_rate, steps - accountant.steps,
                                            self.run.truncation), self.caveats())

  def caveats(self) -> tuple[str, ...]:
    """What the epsilon does not cover or assumes, as printed after it.

    Returns:
      ``NOT a proved epsilon`` unless every step was fed the package's Poisson batches;
        the fixed noise seed, if ``DPConfig.noise_seed`` was given; un-noised statistics
        logged, if a run had ``debug_metrics``.
    """
    caveats = [] if self.poisson_sampling else [NOT_POISSON]
    if self.config.noise_seed is not None:
      caveats.append(FIXED_NOISE_SEED)
    if any(run.debug_metrics for run in self.state.runs):
      caveats.append("un-noised statistics were logged (debug_metrics), which it does not "
                     "cover")
    return tuple(caveats)

  def epsilon_text(self, epsilon: float) -> str:
    """``epsilon`` to print, with this run's caveats in the same line.

    Args:
      epsilon: an epsilon of this model, e.g. from :meth:`epsilon`.

    Returns:
      The epsilon to 4 significant digits, followed by its caveats (:meth:`caveats`).
    """
    return format(Epsilon(epsilon, self.caveats()), ".4g")

  def max_steps_within_budget(self) -> Optional[int]:
    """Most steps in all whose epsilon stays within ``epsilon_budget``.

    Returns:
      The most steps, counting those taken (the steps taken if they already exceed the
        budget); ``None`` without a budget or without DP.
    """
    if self.epsilon_budget is None or not self.is_private:
      return None
    taken = self.accountant.steps
    if self.epsilon(taken) > self.epsilon_budget:
      return taken
    return largest_within(self.epsilon, self.epsilon_budget, taken,
                          max(taken + 1, taken + self.spec.schedule.total_steps))

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
    make ``fit``, or a custom loop's ``tf.function`` around ``train_step``, trace its step
    twice. ``make_private`` calls it, and ``fit`` again (a recompiled optimizer). A model
    not built yet gets none here: its first trace makes them.
    """
    if self.model.built:
      with self.model.distribute_strategy.scope():
        optimizers.create_weights(self.model.optimizer, self.embedding_backend.optimizer_variables(
            self.model.trainable_variables))

  def track_weights(self) -> None:
    """(Re)starts the fingerprint of the weights the DP step updates through Keras.

    Called by ``make_private`` and whenever the embedding backend changes (after checking
    the weights under the fingerprint kept so far). Left out: tables held by an embedding
    engine (synced to Keras outside the step). Under ``ParameterServerStrategy`` (weights on
    remote servers, steps scheduled asynchronously) no fingerprint is kept.

    Raises:
      WeightsMovedOutsideDPError: the weights moved outside the DP step before the switch.
    """
    if parameter_servers.is_parameter_server(self.model.distribute_strategy):
      self.fingerprint = None
      return
    self.check_weights()
    backend = self.embedding_backend
    engine = () if isinstance(backend, embedding_backends.CpuBackend) else backend.tables
    self.fingerprint = Fingerprint(fingerprinted_variables(self.model, engine),
                                   self.state.weight_fingerprint)
    self.state.bind(self.fingerprint)

  def adopt_loaded_weights(self) -> None:
    """Takes weights just loaded (``set_weights``, ``load_weights``) as the DP step's if the
    records they brought describe them, or, before any step (the record counts none and the
    optimizer has not stepped), if they brought none: initial weights, as ``make_private``
    takes them. Else the fingerprint keeps the DP step's, and the epsilon is refused until
    weights its record describes are loaded back."""
    if self.fingerprint is None:
      return
    bindings = self.state.recorded_bindings()
    if bindings:
      adopt = unbound_reason(bindings, self.fingerprint, strict=True) is None
    else:
      adopt = (int(self.state.steps_taken.numpy()) == 0
               and int(self.model.optimizer.iterations.numpy()) == 0)
    if adopt:
      self.state.bind(self.fingerprint)

  def check_weights(self) -> None:
    """Refuses weights that moved outside the DP step.

    The fingerprint (:mod:`~sparse_dp.training.dp_state.weight_fingerprint`) is
    recomputed from the weights, in ``O(parameters)``.

    Raises:
      WeightsMovedOutsideDPError: the weights changed outside the DP step (another
        model's ``fit``, a shared layer, a custom loop's optimizer, an assign, weights
        loaded from a model without a matching DP record).
    """
    if self.fingerprint is not None and self.fingerprint.moved():
      raise WeightsMovedOutsideDPError(
          f"sparse-dp: the weights of private model '{self.model.name}' changed outside its "
          "DP steps (another model's fit on a model that contains it, a layer shared with a "
          "model trained without DP, an optimizer applied in a custom loop, an assign, "
          "set_weights/load_weights of weights without a matching DP record): no epsilon "
          "covers them, so none is given. Train the private model only through its own fit, "
          "train_on_batch or train_step; load back weights a DP run saved")

  def check_no_refused_steps(self) -> None:
    """Refuses the epsilon once the DP step refused a step that bypassed the host guards.

    Raises:
      StepsRefusedError: a step ran past the epsilon budget, or on a batch larger than the
        declared rate allows, where no host guard ran (the compiled step called directly).
    """
    refused = int(self.refused_steps.numpy()) if self.is_private else 0
    if refused:
      raise StepsRefusedError(
          f"sparse-dp: the DP step of model '{self.model.name}' refused {refused} step(s): "
          "past the epsilon budget, or on a batch larger than any Poisson sample of the "
          "declared rate (the compiled step was called directly, where fit's guards do not "
          "run and XLA drops the step's asserts). Those steps applied an update that used no "
          "data and were not counted, but the loop that made them is not the one the "
          "accountant describes, so this object gives no epsilon. Train with fit (or "
          "train_on_batch) and private.callback(), feed private.poisson_dataset(...), and "
          "stop at the budget")

  def report(self) -> PrivacyReport:
    """The privacy report of every step the model has taken.

    Returns:
      This run's :class:`~sparse_dp.accounting.PrivacyReport`, with the steps and
        selections of earlier runs on the model composed into its epsilon.

    Raises:
      WeightsMovedOutsideDPError: the weights moved outside the DP step.
    """
    self.check_weights()
    self.check_no_refused_steps()
    accountant = self.accountant
    spec = dataclasses.replace(self.spec, schedule=BatchSchedule.constant(
        self.sampling_rate, accountant.steps - self.run.first_step))
    return PrivacyReport.compute(
        spec, self.delta, num_examples=self.num_examples, ledger=accountant,
        poisson_sampling=self.poisson_sampling,
        debug_metrics=any(run.debug_metrics for run in self.state.runs),
        fixed_noise_seed=self.config.noise_seed is not None,
        dense_tables=tuple(self.step_noise.dense_tables) if self.step_noise else ())

  def callback(self, log_every_steps: int = 50):
    """The Keras callback that logs ``epsilon`` and stops training at the budget.

    Args:
      log_every_steps: batch logs refresh the epsilon spent each time the steps pass
        a multiple of this many.

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


def largest_within(value, bound: float, low: int, guess: int) -> int:
  """The largest ``n >= low`` with ``value(n) <= bound``, for ``value`` increasing in ``n``.

  ``value(low) <= bound``. Epsilon grows about as a power of the steps, so the crossing is
  estimated on the line through two points in log-log coordinates and the bracket around it
  tightened; a step that halves nothing is followed by a bisection. About 4-6 calls of
  ``value`` (each the epsilon of a composed PLD), where a doubling search then a bisection
  from ``low`` takes ``2 log2(n)``.

  Args:
    value: increasing function of a step count (epsilon after ``n`` steps).
    bound: the budget.
    low: a count with ``value(low) <= bound``.
    guess: a first count to try, ``> low`` (the steps the noise was calibrated for, if known).
  """
  points = {}

  def within(n: int) -> bool:
    points[n] = value(n)
    return points[n] <= bound

  def crossing(a: int, b: int) -> float:
    """Where the log-log line through ``a`` and ``b`` meets ``bound``."""
    if min(a, points.get(a, 0.0), points[b]) <= 0 or points[a] == points[b]:
      return 2.0 * b  # one usable point: grow
    slope = math.log(points[b] / points[a]) / math.log(b / a)
    return b * (bound / points[b]) ** (1.0 / slope) if slope > 0 else 2.0 * b

  lo, hi, n = low, None, guess
  while hi is None:
    if within(n):
      previous, lo = lo, n
      n = int(min(max(crossing(previous, lo), lo + 1), 64 * lo + 1))
    else:
      hi = n
  bisect = False
  while hi - lo > 1:
    width = hi - lo
    m = (lo + hi) // 2 if bisect or lo == 0 else int(crossing(lo, hi))
    m = min(max(m, lo + 1), hi - 1)
    if within(m):
      lo = m
      if m + 1 < hi and within(m + 1):  # the crossing is often just past m
        lo = m + 1
      elif m + 1 < hi:
        hi = m + 1
    else:
      hi = m
    bisect = 2 * (hi - lo) > width
  return lo


def epsilon_budget(config: DPConfig) -> Optional[float]:
  """The epsilon training must stop at: ``epsilon_budget``, else ``target_epsilon``, else none."""
  return config.epsilon_budget if config.epsilon_budget is not None else config.target_epsilon
