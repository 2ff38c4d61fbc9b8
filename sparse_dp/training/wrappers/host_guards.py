"""The DP step's guards, enforced on the host where XLA would compile them away.

Inside the DP step ``tf.debugging.Assert`` refuses a step past the epsilon budget and a
non-Poisson batch larger than the declared rate allows; XLA (``jit_compile=True``, every TPU
program) compiles an ``Assert`` to nothing. The step keeps its asserts, and these checks run
outside the compiled program, before each step of a compiled model: the budget, by a callback
``fit`` gets (:class:`HostGuards`); ids outside a table's vocabulary (read as NaN rows, their
examples' gradients zeroed, flagged and refused by the same callback); a table's
false positives past their room (probability ``<= 1e-18`` per table and step, refused after
that step); and the batch size of an input that is not this run's Poisson batches, in its
``tf.data`` pipeline, by ``batch_size`` or by ``train_on_batch``'s batch. They are the first
refusal, with a clear error: the step itself applies no update past the budget or on too large
a batch (:mod:`~sparse_dp.training.wrappers.dp_train_step`). See docs/tpu.md ("Compiled with
XLA").
"""

from __future__ import annotations

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.training.dp_step.step import IDS_OUTSIDE, OVER_CAPACITY, OVER_CAPACITY_MESSAGE
from sparse_dp.training.poisson import padded_batches
from sparse_dp.training.poisson.poisson_sampling import (
  BATCH_SIZE_FALSE_ALARM,
  largest_plausible_batch,
)
from sparse_dp.training.wrappers.callbacks import BudgetExhaustedError
from sparse_dp.training.wrappers.private_training import PrivateTraining


def budget_message(training: PrivateTraining) -> str:
  return (f"sparse-dp: the epsilon budget {training.epsilon_budget} allows no further step "
          "(pass private.callback() to fit to stop cleanly)")


def too_large_message(training: PrivateTraining) -> str:
  """Why a non-Poisson batch larger than :func:`largest_plausible_batch` is refused."""
  return (
      f"sparse-dp: this batch is larger than any Poisson sample of the declared expected "
      f"batch size {training.batch_size:g} (q = {training.sampling_rate:.4g} of "
      f"{training.num_examples:,} examples) reaches except with probability "
      f"{BATCH_SIZE_FALSE_ALARM:g} (at most {largest_batch(training)}), so the accounted "
      "epsilon would be false. Feed fit private.poisson_dataset(...), or pass make_private "
      "the batch size you feed (batch_size=...). Realised batch size:")


def largest_batch(training: PrivateTraining) -> int:
  return largest_plausible_batch(training.num_examples, training.sampling_rate)


def refuse_past_budget(training: PrivateTraining) -> None:
  """Raises :class:`BudgetExhaustedError` if the budget allows no further step."""
  limit = int(training.step_limit.numpy())
  if 0 <= limit <= int(training.state.steps_taken.numpy()):
    raise BudgetExhaustedError(budget_message(training))


class HostGuards(keras.callbacks.Callback):
  """Refuses a step of ``fit`` past the budget (before it), and ids outside a vocabulary."""

  def __init__(self, training: PrivateTraining):
    super().__init__()
    self.training = training
    self._supports_tf_logs = True  # reads a log only when a compiled step wrote one

  def on_train_batch_begin(self, batch, logs=None):
    refuse_past_budget(self.training)

  def on_train_batch_end(self, batch, logs=None):
    refuse_compiled_step_flags(logs)

  def on_epoch_end(self, epoch, logs=None):
    refuse_compiled_step_flags(logs)


def refuse_compiled_step_flags(logs) -> None:
  """Raises on what a compiled step flagged in ``logs``; removes the flags from ``logs``."""
  _refuse_over_capacity(logs.pop(OVER_CAPACITY, 0) if logs else 0)
  _refuse_ids_outside(logs)


def _refuse_over_capacity(tables: float) -> None:
  if tables:
    raise ValueError(f"{OVER_CAPACITY_MESSAGE} ({int(tables)} table(s) this step)")


def _refuse_ids_outside(logs) -> None:
  """Raises if a compiled step saw ids outside a vocabulary; removes the flags from ``logs``."""
  flags = {key: logs.pop(key) for key in [k for k in (logs or {}) if k.startswith(IDS_OUTSIDE)]}
  bad = [key.split("/", 1)[1] for key, value in flags.items() if value]
  if bad:
    raise ValueError(
        "sparse-dp: Embedding layer(s) " + ", ".join(bad)
        + " looked up ids outside the vocabulary, or, in a TPU embedding engine, ids that the "
        "example did not send the engine. Under XLA (jit_compile=True, or on a TPU) the step "
        "zeroed those examples' gradients instead of stopping; map the ids into "
        "[0, vocabulary_size) (hash or bucket them) before training, and give the input_ids "
        "of make_private or TPUTrainer each table's ids of an example as the layer looks "
        "them up")


def refuse_batch_size(training: PrivateTraining, size: int) -> None:
  """Raises if a non-Poisson batch of ``size`` examples is implausibly large."""
  if size > largest_batch(training):
    raise ValueError(f"{too_large_message(training)} {size}")


def checked_batches(training: PrivateTraining, dataset: tf.data.Dataset) -> tf.data.Dataset:
  """``dataset`` whose pipeline refuses a batch larger than the declared rate allows."""
  largest, message = largest_batch(training), too_large_message(training)

  def check(*batch):
    examples, in_batch = padded_batches.split(batch[0] if len(batch) == 1 else batch)
    first = tf.nest.flatten(examples, expand_composites=False)[0]
    size = (tf.math.count_nonzero(in_batch) if in_batch is not None else
            first.nrows() if isinstance(first, tf.RaggedTensor) else
            first.dense_shape[0] if isinstance(first, tf.SparseTensor) else tf.shape(first)[0])
    with tf.control_dependencies([tf.debugging.assert_less_equal(
        tf.cast(size, tf.int64), tf.constant(largest, tf.int64), message=message)]):
      return tf.nest.map_structure(tf.identity, batch if len(batch) > 1 else batch[0])

  return dataset.map(check)
