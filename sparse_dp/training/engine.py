"""``make_private``: the one entry point that makes a compiled Keras model DP."""

from __future__ import annotations

import dataclasses
import math
import secrets
import types
from typing import Optional

import tensorflow as tf

from sparse_dp.accounting import (BatchSchedule, PrivacyAccountant, PrivacyReport,
                                  PrivacySpec, calibrate, steps_for_epochs)
from sparse_dp.optimizers import sparse_optimizer
from sparse_dp.training import dense_layers
from sparse_dp.training.config import DPConfig
from sparse_dp.training.losses import per_example_loss_fn
from sparse_dp.training.sampling import poisson_batches
from sparse_dp.training.step import StepNoise, private_gradients


class PrivateTraining:
  """The DP state of one model: its noise, its accountant, its sampler.

  Made by :func:`make_private`; query ``epsilon()`` at any time, pass
  ``callback()`` to ``fit``, and feed ``poisson_dataset(...)`` for a proved
  guarantee.
  """

  def __init__(self, model, config: DPConfig, num_examples: int, batch_size: float,
               spec: Optional[PrivacySpec]):
    self.model = model
    self.config = config
    self.num_examples = num_examples
    self.batch_size = batch_size
    self.sampling_rate = batch_size / num_examples
    self.delta = config.delta if config.delta is not None else 1.0 / num_examples
    self.spec = spec
    # The noise and the sample must be unpredictable: without a seed from the
    # user, one from the OS's cryptographic source.
    self.seed = config.noise_seed if config.noise_seed is not None else secrets.randbits(62)
    self.poisson_sampling = False
    self._accountant = PrivacyAccountant("pld")
    if spec is not None and spec.algorithm.uses_top_k_selection:
      self._accountant.spend_pure(spec.selection_epsilon)
    self.epsilon_budget = (config.epsilon_budget if config.epsilon_budget is not None
                           else config.target_epsilon)
    # Steps the DP train_step has taken, counted in the graph; the accountant
    # follows it, so epsilon is right with or without the callback.
    with model.distribute_strategy.scope():
      counter = dict(dtype=tf.int64, trainable=False,
                     synchronization=tf.VariableSynchronization.ON_WRITE,
                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      self.steps_taken = tf.Variable(0, name="dp_steps_taken", **counter)
      self.step_limit = tf.Variable(-1, name="dp_step_limit", **counter)
    if spec is not None and self.epsilon_budget is not None:
      self.step_limit.assign(self.max_steps_within_budget())

  @property
  def accountant(self) -> PrivacyAccountant:
    """The accountant, brought up to the steps taken."""
    behind = int(self.steps_taken.numpy()) - self._accountant.steps
    if behind > 0:
      self._accountant.step(self.step_noise_multiplier, self.sampling_rate, behind)
    return self._accountant

  @property
  def is_private(self) -> bool:
    return self.spec is not None

  @property
  def step_noise_multiplier(self) -> float:
    """The one Gaussian a training step amounts to, for the accountant."""
    return self.spec.training_noise_multiplier

  def epsilon(self, steps: Optional[int] = None) -> float:
    """Epsilon spent after the steps taken so far (or after ``steps`` in all)."""
    if not self.is_private:
      return math.inf
    if steps is None:
      return self.accountant.get_epsilon(self.delta)
    return self.accountant.epsilon_after(self.delta, self.step_noise_multiplier,
                                         self.sampling_rate, steps - self.accountant.steps)

  def max_steps_within_budget(self) -> Optional[int]:
    """Most steps in all whose epsilon stays within ``epsilon_budget``."""
    if self.epsilon_budget is None or not self.is_private:
      return None
    low, high = self.accountant.steps, max(2 * self.accountant.steps, 1)
    if self.epsilon(low) > self.epsilon_budget:
      return low
    while self.epsilon(high) <= self.epsilon_budget:
      low, high = high, 2 * high
    while high - low > 1:
      middle = (low + high) // 2
      low, high = (middle, high) if self.epsilon(middle) <= self.epsilon_budget else (low, middle)
    return low

  def report(self) -> PrivacyReport:
    """The privacy report of the steps taken so far."""
    steps = self.accountant.steps
    spec = dataclasses.replace(self.spec,
                               schedule=BatchSchedule.constant(self.sampling_rate, steps))
    return PrivacyReport.compute(spec, self.delta, num_examples=self.num_examples,
                                 poisson_sampling=self.poisson_sampling)

  def poisson_dataset(self, x, y=None, sample_weight=None, epochs: float = 1.0) -> tf.data.Dataset:
    """Poisson-sampled batches of in-memory ``(x, y, sample_weight)`` for ``epochs``."""
    data = tuple(t for t in (x, y, sample_weight) if t is not None)
    self.poisson_sampling = True
    return poisson_batches(data if len(data) > 1 else data[0], self.sampling_rate,
                           steps_for_epochs(epochs, self.sampling_rate), self.seed)

  def callback(self, log_every_steps: int = 50):
    from sparse_dp.training.callbacks import PrivacyCallback  # pylint: disable=import-outside-toplevel
    return PrivacyCallback(self, log_every_steps)


def make_private(model: tf.keras.Model, config: DPConfig, *, num_examples: int,
                 batch_size: float, epochs: Optional[float] = None) -> PrivateTraining:
  """Makes ``model.fit`` train with ``config``'s DP algorithm.

  Call after ``model.compile``. Installs a DP ``train_step`` on ``model`` (a
  functional model, a ``tf.keras.Model`` subclass or a ``tfrs.Model``),
  replaces its optimizer by one whose table updates stay sparse
  (:func:`sparse_dp.optimizers.sparse_optimizer`), and returns the
  :class:`PrivateTraining` holding the accountant. ``batch_size`` is the
  expected batch size: the noisy sum is divided by it and ``q = B / N``.
  ``epochs`` is needed only to calibrate ``config.target_epsilon``.

  With ``algorithm="none"`` the model trains exactly as plain Keras would.
  """
  if model.optimizer is None:
    raise ValueError("compile the model (optimizer and loss) before make_private")
  if not 0 < batch_size <= num_examples:
    raise ValueError(f"batch_size must be in (0, num_examples={num_examples}], got {batch_size}")
  algorithm = config.kind
  if not algorithm.is_private:
    return PrivateTraining(model, config, num_examples, batch_size, spec=None)
  leaves = dense_layers.trainable_leaf_layers(model)  # fails early on unsupported layers
  spec = _resolve_spec(config, num_examples, batch_size, epochs)
  noise = StepNoise(
      gradient_multiplier=spec.sigma2 if algorithm.uses_contribution_map else spec.noise_multiplier,
      contribution_multiplier=spec.sigma1 if algorithm.uses_contribution_map else None,
      l2_norm_clip=config.l2_norm_clip, contribution_clip=config.contribution_clip,
      threshold=config.threshold_for(spec.sigma1) if algorithm.uses_contribution_map else 0.0,
      expected_batch_size=float(batch_size))
  model.optimizer = sparse_optimizer(model.optimizer)
  training = PrivateTraining(model, config, num_examples, batch_size, spec)
  model.train_step = types.MethodType(_dp_train_step(leaves, noise, training), model)
  model.train_function = None
  return training


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


def _dp_train_step(leaves, noise: StepNoise, training: PrivateTraining):
  base_seed = tf.constant([training.seed, 0x2545F491], tf.int64)

  def train_step(self, data):
    within_budget = tf.debugging.Assert(
        tf.logical_or(training.step_limit < 0, training.steps_taken < training.step_limit),
        [f"sparse-dp: the epsilon budget {training.epsilon_budget} allows no further step "
         "(pass private.callback() to fit to stop cleanly)"])
    with tf.control_dependencies([within_budget]):
      step_seed = tf.random.experimental.stateless_fold_in(base_seed, training.steps_taken)
    def update_metrics(y, y_pred):
      self.compiled_loss(y, y_pred, regularization_losses=self.losses)
      self.compiled_metrics.update_state(y, y_pred)

    gradients, losses, stats = private_gradients(
        leaves, per_example_loss_fn(self), data, noise, step_seed,
        training.config.microbatch_size, on_outputs=update_metrics)
    variables = [v for v in self.trainable_variables if v.ref() in gradients]
    self.optimizer.apply_gradients([(gradients[v.ref()], v) for v in variables])
    training.steps_taken.assign_add(1)
    logs = {m.name: m.result() for m in self.metrics}
    logs.setdefault("loss", tf.reduce_mean(losses))
    return {**logs, **stats}

  return train_step
