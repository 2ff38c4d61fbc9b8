"""Epsilon in the Keras logs, and a stop before the budget is exceeded."""

from __future__ import annotations

import math

import tensorflow as tf


class BudgetExhaustedError(RuntimeError):
  """The epsilon budget allows no further training step."""


class PrivacyCallback(tf.keras.callbacks.Callback):
  """Logs ``epsilon`` and stops training before the budget is exceeded.

  Batch logs carry ``epsilon`` as an upper bound: the exact epsilon at the
  next multiple of ``log_every_steps`` (PLD accounting is too slow to run every
  step); epoch logs carry the exact epsilon after the epoch. Training stops
  after the last step that keeps epsilon within the budget, with a message;
  if not even one step fits, ``fit`` fails before its first step.
  """

  def __init__(self, training, log_every_steps: int = 50):
    super().__init__()
    self.training = training
    self.log_every_steps = max(1, int(log_every_steps))
    self._bound_at: tuple[int, float] = (-1, math.nan)
    self._steps_before_epoch = 0
    self._step_limit = -1
    # Reads no log values, so Keras need not copy them to NumPy (a wait) every step.
    self._supports_tf_logs = True

  def on_train_begin(self, logs=None):
    self._step_limit = int(self.training.step_limit.numpy())
    taken = int(self.training.steps_taken.numpy())
    if 0 <= self._step_limit <= taken:
      raise BudgetExhaustedError(
          f"sparse-dp: the epsilon budget {self.training.epsilon_budget:g} allows no "
          f"further step (one more would bring epsilon to "
          f"{self.training.epsilon(self.training.accountant.steps + 1):.4g}); raise the "
          "budget or the noise, or lower the sampling rate")
    self._epsilon_bound(taken + 1)  # the first bound before Keras times the batches

  def _epsilon_bound(self, steps: int) -> float:
    checkpoint = -(-steps // self.log_every_steps) * self.log_every_steps
    if self._bound_at[0] != checkpoint:
      self._bound_at = (checkpoint, self.training.epsilon(checkpoint))
    return self._bound_at[1]

  def on_epoch_begin(self, epoch, logs=None):
    # One read of the step counter per epoch: reading it every batch would make
    # Keras wait for each step to finish before dispatching the next.
    self._steps_before_epoch = int(self.training.steps_taken.numpy())

  def on_train_batch_end(self, batch, logs=None):
    training = self.training
    if not training.is_private:
      return
    steps = self._steps_before_epoch + batch + 1  # ``batch``: the last step run, from 0
    if logs is not None:
      logs["epsilon"] = self._epsilon_bound(steps)
    if 0 <= self._step_limit <= steps:
      self.model.stop_training = True
      print(f"\nsparse-dp: stopping after step {steps}: one more step would exceed the "
            f"epsilon budget {training.epsilon_budget:g} (spent {training.epsilon():.4g}).")

  def on_epoch_end(self, epoch, logs=None):
    if logs is not None and self.training.is_private:
      logs["epsilon"] = self.training.epsilon()
