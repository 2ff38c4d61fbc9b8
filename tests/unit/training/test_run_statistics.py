"""The gradient size over every step of a run, in the logs and on the progress bar."""

import re

import numpy as np

import sparse_dp
from sparse_dp import keras

from support.keras_models import VOCAB, N, functional_model, synthetic_data


class RowsChanged(keras.callbacks.Callback):
  """Each step's table rows that moved: the rows its update had (SGD, noise on every one)."""

  def __init__(self, table):
    super().__init__()
    self.table, self.per_step = table, []

  def on_train_batch_begin(self, batch, logs=None):
    self.before = self.table.numpy()

  def on_train_batch_end(self, batch, logs=None):
    self.per_step.append(int(np.any(self.table.numpy() != self.before, axis=1).sum()))


def _logged(text: str, key: str) -> float:
  """The last value of ``key`` on the progress bar's output."""
  return float(re.findall(rf"\b{key}: ([0-9.e+-]+)", text)[-1])


def test_the_logs_and_the_bar_hold_every_steps_gradient_size_and_the_epsilon_spent(capsys):
  ids, labels = synthetic_data()
  model = functional_model()
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig("adafest", sigma1=3.0, sigma2=0.8, threshold=6.0, noise_seed=4),
      num_examples=N, batch_size=128)
  rows = RowsChanged(model.get_layer("ids").embeddings)
  history = model.fit(private.poisson_dataset(ids, labels, epochs=0.125), epochs=2, verbose=1,
                      callbacks=[private.callback(), rows]).history
  steps = rows.per_step
  assert len(steps) == 8 and len(set(steps)) > 1  # steps of different sizes
  # Each epoch's logs: every step so far, not that epoch's last step.
  np.testing.assert_allclose(history["nonzero_rows"], [np.mean(steps[:4]), np.mean(steps)],
                             rtol=1e-6)
  assert history["nonzero_rows_min"][-1] == min(steps)
  assert history["nonzero_rows_max"][-1] == max(steps)
  np.testing.assert_allclose(history["nonzero_coordinates"][-1], 8 * np.mean(steps), rtol=1e-6)
  np.testing.assert_allclose(history["gradient_size_reduction"][-1], VOCAB / np.mean(steps),
                             rtol=1e-6)
  assert private.run_statistics.result()["nonzero_rows"] == np.mean(steps)
  # The bar's last line: the epsilon spent and the run's mean, not their averages over steps.
  bar = capsys.readouterr().out
  np.testing.assert_allclose(_logged(bar, "epsilon"), private.epsilon(), rtol=1e-3)
  np.testing.assert_allclose(_logged(bar, "nonzero_rows"), np.mean(steps), rtol=1e-3)
  # A new fit is a new run.
  model.fit(private.poisson_dataset(ids, labels, epochs=0.03125), verbose=0,
            callbacks=[rows])
  assert private.run_statistics.result()["nonzero_rows"] == steps[-1]
