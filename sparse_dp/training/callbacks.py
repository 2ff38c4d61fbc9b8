"""Epsilon in the Keras logs, and a stop before the budget is exceeded."""

from __future__ import annotations

import math

import tensorflow as tf


class PrivacyCallback(tf.keras.callbacks.Callback):
  """Records each step with the accountant and logs ``epsilon``.

  Batch logs carry ``epsilon`` as an upper bound: the exact epsilon at the
  next multiple of ``log_every_steps`` (PLD accounting is too slow to run every
  step); epoch logs carry the exact epsilon after the epoch. Training stops
  after the last step that keeps epsilon within the budget, with a message.
  """

  def __init__(self, training, log_every_steps: int = 50):
    super().__init__()
    self.training = training
    self.log_every_steps = max(1, int(log_every_steps))
    self._bound_at: tuple[int, float] = (-1, math.nan)
    self._max_steps = None

  def on_train_begin(self, logs=None):
    self._max_steps = self.training.max_steps_within_budget()
    if self._max_steps is not None and self._max_steps <= self.training.accountant.steps:
      self.model.stop_training = True
      print(f"sparse-dp: the epsilon budget {self.training.epsilon_budget:g} is spent; "
            "not training.")

  def on_train_batch_end(self, batch, logs=None):
    training = self.training
    if not training.is_private:
      return
    training.accountant.step(training.step_noise_multiplier, training.sampling_rate)
    steps = training.accountant.steps
    checkpoint = -(-steps // self.log_every_steps) * self.log_every_steps
    if self._bound_at[0] != checkpoint:
      self._bound_at = (checkpoint, training.epsilon(checkpoint))
    if logs is not None:
      logs["epsilon"] = self._bound_at[1]
    if self._max_steps is not None and steps >= self._max_steps:
      self.model.stop_training = True
      print(f"\nsparse-dp: stopping after step {steps}: one more step would exceed the "
            f"epsilon budget {training.epsilon_budget:g} (spent {training.epsilon():.4g}).")

  def on_epoch_end(self, epoch, logs=None):
    if logs is not None and self.training.is_private:
      logs["epsilon"] = self.training.epsilon()
