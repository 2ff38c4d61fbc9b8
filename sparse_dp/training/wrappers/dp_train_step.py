"""The DP ``train_step`` that
:func:`~sparse_dp.training.wrappers.entry_point.make_private` installs."""

from __future__ import annotations

import tensorflow as tf

from sparse_dp import mechanisms
from sparse_dp._keras import keras
from sparse_dp.training.dp_step.losses import per_example_loss_fn
from sparse_dp.training.dp_step.penalties import add_penalty_gradients
from sparse_dp.training.dp_step.step import StepNoise, private_gradients
from sparse_dp.training.dp_step.update_guard import dp_step_update, withheld
from sparse_dp.training.poisson import padded_batches
from sparse_dp.training.wrappers.host_guards import budget_message, largest_batch, too_large_message
from sparse_dp.training.wrappers.private_training import PrivateTraining


def _batch_size(data, in_batch) -> tf.Tensor:
  """Examples in the whole (global) batch ``data`` (the sampled ones, if padded)."""
  first = tf.nest.flatten(data)[0]
  if in_batch is not None:
    size = tf.math.count_nonzero(in_batch, dtype=tf.int64)
  elif isinstance(first, tf.RaggedTensor):
    size = first.nrows(out_type=tf.int64)
  elif isinstance(first, tf.SparseTensor):
    size = first.dense_shape[0]
  else:
    size = tf.shape(first, out_type=tf.int64)[0]
  context = tf.distribute.get_replica_context()
  if context is not None and context.num_replicas_in_sync > 1:  # summed in int32: any TPU's
    size = tf.cast(context.all_reduce(tf.distribute.ReduceOp.SUM, tf.cast(size, tf.int32)),
                   tf.int64)
  return size


def scheduled_step_seed(seed: int, scheduled_step) -> tf.Tensor:
  """The seed of the step numbered ``scheduled_step`` when it was counted.

  Keras's ``fit`` keys each step by the counters it reads in the step
  (``steps_taken``, ``noise_draws``), which is safe only when one step runs at
  a time. Workers that step asynchronously (``ParameterServerStrategy``) read
  the same counters at once; each attempt of their steps
  (:class:`sparse_dp.distribute.ParameterServerTraining`) instead counts itself
  first and takes the count's distinct number
  (:meth:`~sparse_dp.training.dp_state.state.DPState.number_step`), and passes it
  here: no two attempts share a noise or selection seed. The batch of such a
  step is the Poisson sample keyed by the same number.
  """
  base = tf.constant([seed, 0x5CED_57E9], tf.int64)
  return mechanisms.fold_in(base, scheduled_step)


def dp_train_step(leaves, noise: StepNoise, penalty, training: PrivateTraining):
  """The DP ``train_step``: budget and batch-size checks, the DP gradient, the counters.

  On a step not fed this run's Poisson batches the realised batch size must
  not exceed :func:`largest_plausible_batch` of the declared rate (a Poisson
  batch exceeds it with probability ``1e-9``): a larger batch means the real
  sampling rate, hence the real epsilon, is larger than the accountant's.
  Both asserts are checked again on the host (:mod:`~sparse_dp.training.wrappers.host_guards`),
  where XLA cannot compile them away.
  Logs hold only DP statistics unless ``config.debug_metrics``: then also the
  un-noised loss and compiled metrics, which the epsilon does not cover.
  ``penalty`` (weight regularizers, :mod:`sparse_dp.training.dp_step.penalties`) adds
  its gradient after the noise.
  """
  base_seed = tf.constant([training.seed, 0x2545F491], tf.int64)
  state, config = training.state, training.config
  largest, too_large = largest_batch(training), too_large_message(training)

  def train_step(self, data, scheduled_step=None):
    """One DP step; ``scheduled_step``: its number, counted already (see
    :func:`scheduled_step_seed`)."""
    data, in_batch = padded_batches.split(data)
    number = state.steps_taken if scheduled_step is None else scheduled_step
    within_budget = tf.debugging.Assert(
        tf.logical_or(training.step_limit < 0, number < training.step_limit),
        [budget_message(training)])
    poisson = (tf.convert_to_tensor(training.poisson_input) if scheduled_step is None
               else tf.constant(True))
    size = _batch_size(data, in_batch)
    plausible = tf.debugging.Assert(tf.logical_or(poisson, size <= largest), [too_large, size])
    # The asserts are a first refusal, which XLA compiles away; ``allowed`` holds anyway: a
    # refused step applies an update that uses no data, is not counted, and is recorded in
    # ``refused_steps``, which makes epsilon() refuse.
    allowed = tf.logical_and(
        tf.logical_or(training.step_limit < 0, number < training.step_limit),
        tf.logical_or(poisson, size <= largest))
    with tf.control_dependencies([within_budget, plausible]):
      if scheduled_step is None:
        step_seed = mechanisms.fold_in(mechanisms.fold_in(base_seed, state.steps_taken),
                                       training.noise_draws)
      else:
        step_seed = scheduled_step_seed(training.seed, scheduled_step)

    def update_metrics(y, y_pred, in_batch_weights):
      # A padded batch: the metrics weigh each sampled example 1 and the padding 0;
      # Keras's loss divides by all rows, so its weights are scaled to make each
      # step's loss the mean over the sampled examples.
      loss_weights = (None if in_batch_weights is None else in_batch_weights
                      * tf.cast(tf.size(in_batch_weights), tf.float32)
                      / tf.maximum(tf.reduce_sum(in_batch_weights), 1.0))
      self.compiled_loss(y, y_pred, loss_weights, regularization_losses=self.losses)
      self.compiled_metrics.update_state(y, y_pred, in_batch_weights)

    features, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    with training.embedding_backend.training_step(features):
      gradients, losses, stats = private_gradients(
          leaves, per_example_loss_fn(self), data, noise, step_seed, config.microbatch_size,
          on_outputs=update_metrics if config.debug_metrics else None,
          debug_metrics=config.debug_metrics, in_batch=in_batch,
          loss_scale=training.loss_scale)
    gradients = withheld(add_penalty_gradients(penalty, gradients), allowed,
                         every_row=not noise.sparse)
    # A scheduled step was counted when it was numbered: every update op (tables,
    # Dense weights, on every replica) runs after that count, so an attempt lost
    # at any point of its update is counted.
    counted = [] if scheduled_step is None else [scheduled_step]
    with dp_step_update(), tf.control_dependencies(counted):
      # the one update a private model's optimizer applies
      fingerprint = training.fingerprint
      read, gradients = (fingerprint.before_update(gradients) if fingerprint is not None
                         else ([], gradients))
      training.embedding_backend.apply_gradients(self.optimizer, self.trainable_variables,
                                                 gradients)
      if fingerprint is not None:  # s(w) follows the update (weight_fingerprint)
        moved, deltas = fingerprint.after_update(read)
        with tf.control_dependencies([moved]):
          state.bind_in_step(deltas)
    with tf.control_dependencies([within_budget, plausible]):  # not counted if they stopped it
      training.refused_steps.assign_add(tf.cast(tf.logical_not(allowed), tf.int64))
    stats = {key: value * tf.cast(allowed, value.dtype) for key, value in stats.items()}
    if scheduled_step is None:
      # After the batch is read: a call that finds the input exhausted counts nothing.
      with tf.control_dependencies([step_seed]):
        state.count_step(poisson, allowed)
        training.noise_draws.assign_add(1)
      # The run's gradient size so far (run_statistics), in place of this step's alone.
      stats = {**stats, **training.run_statistics.record(
          stats["nonzero_rows"], stats["nonzero_coordinates"], counted=allowed)}
    if not config.debug_metrics:
      return stats
    logs = {m.name: m.result() for m in self.metrics}
    examples = (tf.size(losses) if in_batch is None
                else tf.math.count_nonzero(in_batch, dtype=tf.int32))
    logs.setdefault("loss", tf.reduce_sum(losses) / tf.cast(tf.maximum(examples, 1), losses.dtype))
    return {**logs, **stats}

  return train_step
