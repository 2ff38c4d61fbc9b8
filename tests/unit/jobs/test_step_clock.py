"""Throughput after the first step, which traces the train function (jobs/train/step_clock.py)."""

import re
import time

import numpy as np
import pytest

from sparse_dp import keras
from sparse_dp.jobs.train.step_clock import StepClock


class SlowFirstCall(keras.callbacks.Callback):
  """Makes the first call of the train function cost ``seconds`` more, as tracing does."""

  def __init__(self, seconds):
    super().__init__()
    self.seconds, self.called = seconds, False

  def on_train_batch_end(self, batch, logs=None):
    if not self.called:
      self.called = True
      time.sleep(self.seconds)


@pytest.mark.parametrize("steps_per_execution", [1, 3])
def test_the_first_call_is_timed_apart_from_the_steps_after_it(steps_per_execution):
  model = keras.Sequential([keras.layers.Dense(1)])
  model.compile(optimizer="sgd", loss="mse", steps_per_execution=steps_per_execution)
  x, y = np.ones((12 * 8, 4), np.float32), np.ones((12 * 8, 1), np.float32)
  clock = StepClock()
  start = time.perf_counter()
  model.fit(x, y, batch_size=8, callbacks=[SlowFirstCall(1.0), clock], verbose=0)
  end = time.perf_counter()
  rates = clock.rates(start, end, steps=12, batch_size=8)
  assert clock.first_steps == steps_per_execution
  # The slow first call is in the first step's seconds and out of the later rate.
  assert rates["first_step_seconds"] >= 1.0
  later = rates["examples_per_second_after_first_step"]
  whole = 12 * 8 / (end - start)
  assert later == pytest.approx((12 - steps_per_execution) * 8 / (end - clock.first_end))
  assert later > 2 * whole


def test_a_job_s_clock_says_once_how_long_the_first_step_took(capsys):
  model = keras.Sequential([keras.layers.Dense(1)])
  model.compile(optimizer="sgd", loss="mse")
  x, y = np.ones((32, 4), np.float32), np.ones((32, 1), np.float32)
  model.fit(x, y, batch_size=8, callbacks=[SlowFirstCall(0.2), StepClock("job")], verbose=0)
  said = re.findall(r"job: first step \(tracing and compiling the train step, then running "
                    r"it\) took ([0-9.]+) s", capsys.readouterr().out)
  assert len(said) == 1 and float(said[0]) >= 0.2


def test_rates_are_none_where_nothing_was_measured():
  clock = StepClock()
  assert clock.rates(0.0, 1.0, steps=5, batch_size=8) == {
      "first_step_seconds": None, "examples_per_second_after_first_step": None}
  clock.first_end, clock.first_steps = 0.5, 5
  assert clock.rates(0.0, 1.0, steps=5, batch_size=8) == {
      "first_step_seconds": 0.5, "examples_per_second_after_first_step": None}
