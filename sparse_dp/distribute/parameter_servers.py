"""DP training on ``tf.distribute.ParameterServerStrategy`` workers.

Keras's ``fit`` would feed each worker its own dataset and key each step's noise by counters
two workers read at once, so it is refused for a private model here
(:func:`refuse_keras_fit`) and :class:`ParameterServerTraining` trains instead. Every attempt
of a step first counts itself, one atomic fetch-and-add of the model's ``steps_taken`` on the
parameter servers (:meth:`~sparse_dp.training.dp_state.state.DPState.number_step`), and takes
that count ``k`` as its key: its batch ``B_k`` is the Poisson sample of all ``N`` examples at
rate ``q`` keyed by ``k``
(:class:`~sparse_dp.training.poisson.poisson_sampling.PoissonSample`), its selection and noise
seeds derive from ``k``, and every op of its update waits for the count. So each attempt that
may have touched the model, a worker's re-run after a loss included, is a counted Poisson step
with fresh noise, and the coordinator schedules no more steps than the budget allows. Not
covered: a restart from an earlier checkpoint than the latest with the same fixed
``noise_seed``. See docs/clusters.md.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from sparse_dp.accounting import steps_for_epochs
from sparse_dp.distribute import shards

_SAMPLE_SALT = 0x5A3F_1E55


def is_parameter_server(strategy: tf.distribute.Strategy) -> bool:
  """Whether ``strategy`` is a ``ParameterServerStrategy``.

  Args:
    strategy: a ``tf.distribute`` strategy.

  Returns:
    True for a ``tf.distribute.experimental.ParameterServerStrategy``.
  """
  return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def refuse_keras_fit(model) -> None:
  """Refuses Keras ``fit``/``train_on_batch`` of a private model on a parameter-server strategy.

  Keras would give each worker its own input and asynchronous steps that can share a noise
  draw, so the epsilon would not hold.
  Train with :class:`ParameterServerTraining` there.

  Args:
    model (keras.Model): the private Keras model.

  Raises:
    ValueError: ``model`` is under a ``ParameterServerStrategy``.
  """
  if is_parameter_server(model.distribute_strategy):
    raise ValueError(
        "sparse-dp: model.fit under ParameterServerStrategy would give each worker its own "
        "input (a DatasetCreator) and asynchronous steps that can share a noise draw, so "
        "the epsilon would not hold. Train with sparse_dp.distribute.ParameterServerTraining"
        "(private, x, y).fit(epochs=...): it schedules Poisson batches and a distinct noise "
        "key per step")


class ParameterServerTraining:
  """Trains a private model (``make_private``'s result) on all its ``(x, y)`` by keyed steps.

  Every attempt of a step first counts itself, by one atomic fetch-and-add of the model's
  ``steps_taken`` on the parameter servers.
  It takes that count ``k`` as its key.
  Its batch is the Poisson sample of all ``N`` examples at rate ``q``, keyed by ``k``.
  Its selection and noise seeds derive from ``k``, and every op of its update waits for the
  count.
  So each attempt that may have touched the model, a worker's re-run after a loss included, is
  a counted Poisson step with fresh noise.
  The coordinator schedules no more steps than the epsilon budget allows.
  A restart from an earlier checkpoint than the latest, with the same fixed ``noise_seed``, is
  not covered.

  It works on a ``ParameterServerStrategy``, whose ``ClusterCoordinator`` schedules the steps
  on its workers.
  It works on any other strategy too, running the steps in order here.
  The keys are the same, so a one-worker schedule equals a single process.

  On several replicas per step (a worker's GPUs, a ``MirroredStrategy``'s devices), each
  replica draws the step's Poisson batch from its key.
  It takes its own disjoint part of it
  (:class:`~sparse_dp.training.poisson.poisson_sampling.PoissonSample`), so the replicas
  together clip each sampled example once.
  The DP step then works as under Keras ``fit`` on such a strategy
  (:mod:`sparse_dp.training.dp_step.step`).
  The selection is the whole batch's, the noise is added on the first replica only, and the
  sum over replicas is the one-replica update.
  See docs/clusters.md.

  Args:
    private (sparse_dp.training.PrivateTraining): ``make_private``'s result, with a private
      algorithm.
    x (Any): all the ``num_examples`` examples' features, or ``(x, y)`` when ``y`` is
      ``None``.
    y (Any): their labels.

  Attributes:
    private: the private model's training.
    model: the Keras model.
    sample: the Poisson sample of the data, keyed by step.
    coordinator: the ``ClusterCoordinator`` on a ``ParameterServerStrategy``, else ``None``.

  Raises:
    ValueError: algorithm ``none``; data of another number of rows than ``num_examples``; or
      Dense layers that the strategy's ``variable_partitioner`` sharded (shard only the
      embedding tables).
  """

  def __init__(self, private, x, y=None):
    if not private.is_private:
      raise ValueError("ParameterServerTraining trains a DP model; algorithm 'none' has no "
                       "noise to schedule: use model.fit")
    self.private = private
    self.sample = private.poisson_sample(x if y is None else (x, y))
    if self.sample.rows != private.num_examples:
      raise ValueError(f"the data has {self.sample.rows:,} rows but make_private was told "
                       f"num_examples={private.num_examples:,}; give all the examples")
    self.model = private.model
    strategy = self.model.distribute_strategy
    sharded_dense = [layer.name for layer in private.leaves
                     if any(shards.is_sharded(getattr(layer, name, None))
                            for name in ("kernel", "bias"))]
    if sharded_dense:
      raise ValueError(
          f"the strategy's variable_partitioner sharded Dense layers {sharded_dense}: DP "
          "clipping reads each Dense layer's whole kernel. Shard only the embedding tables, "
          "e.g. sparse_dp.distribute.local_cluster.TablePartitioner(min_shard_bytes=...), "
          "which shards embedding-shaped variables only")
    self.coordinator = (tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
                        if is_parameter_server(strategy) else None)
    self._step = self._step_function(tf.constant([private.seed, _SAMPLE_SALT], tf.int64))

  def fit(self, *, epochs: Optional[float] = None, steps: Optional[int] = None) -> dict:
    """Trains ``steps`` (or ``epochs`` worth of) Poisson steps on the ``num_examples`` examples.

    It stops early at the epsilon budget.

    Args:
      epochs: the epochs to train, converted to steps at the sampling rate.
      steps: the steps to train, an integer >= 1; give exactly one of ``epochs`` and
        ``steps``.

    Returns:
      The last step's DP statistics, with ``steps`` (scheduled in this call), ``keys`` (each
        one's key), ``attempts`` (counted in this call: ``steps`` plus any attempt re-run after
        a worker failure) and ``epsilon`` (every counted step so far). With no step left in
        the budget, only ``steps`` (0) and ``epsilon``.

    Raises:
      ValueError: both or neither of ``epochs`` and ``steps``, or ``steps`` that is not an
        integer >= 1.
      RuntimeError: the model counted fewer steps than ran, as when its DP state was replaced
        while it trained; the epsilon of the job is then not proved.
    """
    private = self.private
    if (epochs is None) == (steps is None):
      raise ValueError("give exactly one of epochs= or steps=")
    if steps is None:
      steps = steps_for_epochs(epochs, private.sampling_rate)
    if not isinstance(steps, int) or steps < 1:
      raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    private.sync_with_state()
    private.create_optimizer_weights()  # before the step's first trace
    limit = private.max_steps_within_budget()
    taken = int(private.steps_taken.numpy())
    if limit is not None:
      steps = min(steps, limit - taken)
    if steps <= 0:
      return {"steps": 0, "epsilon": private.epsilon()}
    private.run_statistics.reset()
    outputs = [self._run() for _ in range(steps)]
    if self.coordinator is not None:
      self.coordinator.join()
      outputs = [output.fetch() for output in outputs]
    counted = int(private.steps_taken.numpy()) - taken
    if counted < steps:  # every attempt counts itself before it can update
      raise RuntimeError(
          f"sparse-dp: {steps} steps ran but the model counted {counted}: the model's DP "
          "state was replaced while it trained; the epsilon of this job is not proved")
    logs = {name: float(value) for name, value in outputs[-1].items() if name != "key"}
    return {**logs, "keys": [int(output["key"]) for output in outputs], "steps": steps,
            "attempts": counted, "epsilon": private.epsilon()}

  def _run(self):
    if self.coordinator is None:
      return self._step()
    return self.coordinator.schedule(self._step)

  def _step_function(self, base):
    model, sample, state = self.model, self.sample, self.private.state
    strategy = model.distribute_strategy

    def replica_step(seed, key):
      context = tf.distribute.get_replica_context()
      part = sample(seed, context.replica_id_in_sync_group, context.num_replicas_in_sync)
      return model.train_step(part, scheduled_step=key)

    @tf.function
    def step():
      key = state.number_step()  # this attempt's count, before anything else
      stats = strategy.run(replica_step,
                           args=(tf.random.experimental.stateless_fold_in(base, key), key))
      # The first replica's logs, as Keras reports them: the DP statistics are its own.
      first = {name: strategy.experimental_local_results(value)[0]
               for name, value in stats.items()}
      return {**first, "key": key}

    return step


__all__ = ["ParameterServerTraining", "is_parameter_server", "refuse_keras_fit"]
