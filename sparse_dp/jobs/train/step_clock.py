"""Throughput of a ``fit``, with and without its first step.

``model.fit``'s first step traces the train function (and, with
``jit_compile=True``, compiles it) before it runs; on a short run that one-off
cost can exceed all later steps together, and it grows with the graph (26
tables' row selections trace far more ops than DP-SGD's dense noise). So the
jobs report both rates: ``examples_per_second`` over the whole ``fit``, and
``examples_per_second_after_first_step``, the steady rate of the steps after
the first, with the first step's seconds beside them.
"""

from __future__ import annotations

import time
from typing import Optional

from sparse_dp._keras import keras


class StepClock(keras.callbacks.Callback):
  """Records when the first call of ``fit``'s train function ends.

  With ``steps_per_execution = n`` the first call runs ``n`` steps; Keras then
  passes the last step's index, so the steps done by then are ``batch + 1``.

  Args:
    job: where given, the first call's seconds are printed as ``job: first step ...``.
  """

  def __init__(self, job: Optional[str] = None):
    super().__init__()
    self.job = job
    self.begin: Optional[float] = None
    self.first_end: Optional[float] = None
    self.first_steps = 0
    # Reads no log values, so Keras need not copy them to NumPy (a wait) every step.
    self._supports_tf_logs = True

  def on_train_begin(self, logs=None):
    self.begin = time.perf_counter()

  def on_train_batch_end(self, batch, logs=None):
    if self.first_end is None:
      self.first_end = time.perf_counter()
      self.first_steps = int(batch) + 1
      if self.job is not None:
        print(f"\n{self.job}: first step (tracing and compiling the train step, then running "
              f"it) took {self.first_end - self.begin:.1f} s", flush=True)

  def rates(self, start: float, end: float, steps: int, batch_size: float) -> dict:
    """``first_step_seconds`` and ``examples_per_second_after_first_step`` of a ``fit``
    that started at ``start``, ended at ``end`` and took ``steps`` steps of
    ``batch_size`` (expected) examples; ``None`` where not measured (no callback
    call: a loop that runs no Keras callbacks; or no step after the first)."""
    if self.first_end is None:
      return {"first_step_seconds": None, "examples_per_second_after_first_step": None}
    later = steps - self.first_steps
    return {"first_step_seconds": self.first_end - start,
            "examples_per_second_after_first_step":
                later * batch_size / (end - self.first_end) if later > 0 else None}
