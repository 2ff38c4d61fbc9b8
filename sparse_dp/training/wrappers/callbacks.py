"""Epsilon in the Keras logs, and a stop before the budget is exceeded."""

from __future__ import annotations

import math

from sparse_dp._keras import keras


class BudgetExhaustedError(RuntimeError):
  """The epsilon budget allows no further training step.

  Raised by ``fit`` (:class:`PrivacyCallback`) before its first step. Raise the budget or
  the noise, or lower the sampling rate.
  """


NOT_POISSON_KEY = "epsilon_not_poisson"


class PrivacyCallback(keras.callbacks.Callback):
  """Logs ``epsilon`` and stops training before the budget is exceeded.

  Made by :meth:`PrivateTraining.callback`. Batch logs carry ``epsilon`` already spent:
  the exact epsilon of the steps taken, read once per block of ``log_every_steps`` steps
  (when a step or the ``fit`` first enters the block), never one of a step not yet taken;
  PLD accounting is too slow to run every step. Epoch logs carry the exact epsilon after
  the epoch. The key
  is ``epsilon`` only when every step of the model so far, and this ``fit``'s input, are
  the package's Poisson batches. Otherwise the same number is logged as
  ``epsilon_not_poisson``, since the proof does not cover it, and the progress bar says
  so. Training stops after the last step that keeps epsilon within the budget, with a
  message. If not even one step fits, ``fit`` fails before its first step
  (:class:`BudgetExhaustedError`).

  Args:
    training (PrivateTraining): the run whose epsilon is logged.
    log_every_steps: batch logs refresh the epsilon spent each time the steps pass a
      multiple of this many (at least 1).
  """

  def __init__(self, training, log_every_steps: int = 50):
    super().__init__()
    self.training = training
    self.log_every_steps = max(1, int(log_every_steps))
    self._spent_at: tuple[int, float] = (-1, math.nan)
    self._steps_before_epoch = 0
    self._step_limit = -1
    self._key = "epsilon"
    # Reads no log values, so Keras need not copy them to NumPy (a wait) every step.
    self._supports_tf_logs = True

  def on_train_begin(self, logs=None):
    """Reads the step limit and the log key, and refuses a ``fit`` with no step left.

    Args:
      logs: Keras's logs (unused).

    Raises:
      BudgetExhaustedError: the epsilon budget allows not even one more step.
    """
    training = self.training
    if not training.is_private:
      return
    self._step_limit = int(training.step_limit.numpy())
    taken = int(training.steps_taken.numpy())
    self._key = ("epsilon" if training.feeding_poisson and training.poisson_sampling
                 else NOT_POISSON_KEY)
    if 0 <= self._step_limit <= taken:
      raise BudgetExhaustedError(
          f"sparse-dp: the epsilon budget {training.epsilon_budget:g} allows no "
          f"further step (one more would bring epsilon to "
          f"{training.epsilon_text(training.epsilon(training.accountant.steps + 1))}); raise "
          "the budget or the noise, or lower the sampling rate")
    self._epsilon_spent(taken)  # the first value before Keras times the batches

  def _epsilon_spent(self, steps: int) -> float:
    """The exact epsilon of the steps taken, read again when ``steps`` passes a multiple
    of ``log_every_steps``: a value already spent (refused steps spend nothing)."""
    mark = steps // self.log_every_steps
    if self._spent_at[0] != mark:
      self._spent_at = (mark, self.training.epsilon(int(self.training.steps_taken.numpy())))
    return self._spent_at[1]

  def on_epoch_begin(self, epoch, logs=None):
    """Reads the steps taken before the epoch, once.

    Args:
      epoch: the epoch's index (unused).
      logs: Keras's logs (unused).
    """
    if not self.training.is_private:
      return
    # One read of the step counter per epoch: reading it every batch would make
    # Keras wait for each step to finish before dispatching the next.
    self._steps_before_epoch = int(self.training.steps_taken.numpy())

  def on_train_batch_end(self, batch, logs=None):
    """Logs the epsilon spent and stops after the budget's last step.

    Args:
      batch: the step just run, counted from 0 within the epoch.
      logs: Keras's batch logs; the epsilon spent is written under ``epsilon`` (or
        ``epsilon_not_poisson``).
    """
    training = self.training
    if not training.is_private:
      return
    steps = self._steps_before_epoch + batch + 1  # ``batch``: the last step run, from 0
    if logs is not None:
      logs[self._key] = self._epsilon_spent(steps)
    if 0 <= self._step_limit <= steps:
      self.model.stop_training = True
      print(f"\nsparse-dp: stopping after step {steps}: one more step would exceed the "
            f"epsilon budget {training.epsilon_budget:g} (spent "
            f"{training.epsilon_text(training.epsilon())}).")

  def on_epoch_end(self, epoch, logs=None):
    """Logs the exact epsilon after the epoch.

    Args:
      epoch: the epoch's index (unused).
      logs: Keras's epoch logs; the epsilon is written under ``epsilon`` (or
        ``epsilon_not_poisson``).
    """
    if logs is not None and self.training.is_private:
      logs[self._key] = self.training.epsilon()
