"""What the TPU embedding backend tests share: the DP-AdaFEST settings, the optimizers, and
probes of what the engine's tables and the traced programs touch."""

import numpy as np

from sparse_dp import keras

ADAFEST = dict(sigma1=3.0, sigma2=0.8, threshold=6.0)
OPTIMIZERS = {"sgd": (lambda: keras.optimizers.legacy.SGD(0.5), 1e-6),
              "adagrad": (lambda: keras.optimizers.Adagrad(0.1), 1e-5),
              "adam": (lambda: keras.optimizers.Adam(0.01), 2e-5)}


class EngineRows(keras.callbacks.Callback):
  """After each step: rows of the engine table and slots that changed, and the step's
  ``nonzero_rows`` (the logs hold the run's mean so far: run_statistics)."""

  def __init__(self, backend):
    super().__init__()
    self.backend, self.changed, self.selected = backend, [], []
    self.last = self._state()

  def _state(self):
    return np.concatenate([v.numpy() for v in self.backend.engine.slots("ids").values()], 1)

  def on_train_batch_end(self, batch, logs=None):
    state = self._state()
    self.changed.append(np.flatnonzero(np.any(state != self.last, axis=1)))
    run_rows = round(logs["nonzero_rows"] * (len(self.selected) + 1))
    self.selected.append(run_rows - sum(self.selected))
    self.last = state


def variables_used(function) -> set:
  """Refs of the variables that the traced programs of ``function`` read or write."""
  concrete = function._list_all_concrete_functions_for_serialization()
  assert concrete
  return {variable.ref() for program in concrete for variable in program.graph.variables}
