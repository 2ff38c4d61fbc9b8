"""The gradient size of every DP step of a run, aggregated inside the step.

A step's table update changes ``|S_t|`` rows (the selected rows of DP-AdaFEST, Ghazi et al.,
NeurIPS 2023, Algorithm 1; every row for DP-SGD) and ``sum_tables |S_t| d`` coordinates; the
paper's gradient-size reduction is the tables' rows over the rows a step updates (§4, Fig. 3).
Keras cannot give its mean over a run (an epoch's logs hold its last step, a callback sees
every k-th step under ``steps_per_execution``), so :class:`RunStatistics` keeps the sums,
minimum and maximum in variables the DP step updates (on the first replica), and each step's
logs carry the run's values so far: ``nonzero_rows`` (mean ``|S_t|``), ``nonzero_rows_min``,
``nonzero_rows_max``, ``nonzero_coordinates`` and ``gradient_size_reduction`` (rows of all
tables / ``nonzero_rows``). A run is one ``fit`` (or ``TPUTrainer.fit`` /
``ParameterServerTraining.fit``); the progress bar shows these keys as logged (:data:`LOGGED`).
See docs/epsilon.md ("Honest logs").
"""

from __future__ import annotations

import tensorflow as tf

#: The keys of the step's logs that hold the run's values so far.
LOGGED = ("nonzero_rows", "nonzero_rows_min", "nonzero_rows_max", "nonzero_coordinates",
          "gradient_size_reduction")

_FIRST_REPLICA = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_WRITE,
                      aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


class RunStatistics:
  """Sums, minimum and maximum of the update size over a run's DP steps.

  ``table_rows``: the rows of all the model's tables. Create under the model's
  strategy scope.
  """

  def __init__(self, table_rows: int):
    self.table_rows = float(table_rows)
    self._steps = tf.Variable(0.0, dtype=tf.float64, name="run_steps", **_FIRST_REPLICA)
    self._rows = tf.Variable(0.0, dtype=tf.float64, name="run_nonzero_rows", **_FIRST_REPLICA)
    self._coordinates = tf.Variable(0.0, dtype=tf.float64, name="run_nonzero_coordinates",
                                    **_FIRST_REPLICA)
    self._min = tf.Variable(0.0, dtype=tf.float64, name="run_nonzero_rows_min", **_FIRST_REPLICA)
    self._max = tf.Variable(0.0, dtype=tf.float64, name="run_nonzero_rows_max", **_FIRST_REPLICA)

  def reset(self) -> None:
    """Starts a run: no step yet."""
    for variable in (self._steps, self._rows, self._coordinates, self._min, self._max):
      variable.assign(0.0)

  def result(self) -> dict:
    """The run's values (:data:`LOGGED`) as floats, read on the host (``None`` before a step)."""
    steps = float(self._steps.numpy())
    if not steps:
      return dict.fromkeys(LOGGED)
    mean = float(self._rows.numpy()) / steps
    return {"nonzero_rows": mean, "nonzero_rows_min": float(self._min.numpy()),
            "nonzero_rows_max": float(self._max.numpy()),
            "nonzero_coordinates": float(self._coordinates.numpy()) / steps,
            "gradient_size_reduction": self.table_rows / max(mean, 1.0)}

  def record(self, rows: tf.Tensor, coordinates: tf.Tensor, counted=True) -> dict:
    """Adds one step of ``rows`` updated rows and ``coordinates``; returns the run's logs.

    Args:
      rows: rows the step updated.
      coordinates: coordinates it updated.
      counted: a boolean (tensor): false for a refused step, which adds nothing.

    Returns:
      The run's values so far (:data:`LOGGED`), float32.
    """
    counted = tf.convert_to_tensor(counted)
    weight = tf.cast(counted, tf.float64)
    rows, coordinates = tf.cast(rows, tf.float64), tf.cast(coordinates, tf.float64)
    first = tf.equal(self._steps, 0.0)
    low = self._min.assign(tf.where(counted, tf.where(first, rows, tf.minimum(self._min, rows)),
                                    self._min))
    high = self._max.assign(tf.where(counted, tf.where(first, rows, tf.maximum(self._max, rows)),
                                     self._max))
    steps = tf.maximum(self._steps.assign_add(weight), 1.0)
    mean = self._rows.assign_add(weight * rows) / steps
    logs = {"nonzero_rows": mean, "nonzero_rows_min": low, "nonzero_rows_max": high,
            "nonzero_coordinates": self._coordinates.assign_add(weight * coordinates) / steps,
            "gradient_size_reduction": self.table_rows / tf.maximum(mean, 1.0)}
    return {key: tf.cast(value, tf.float32) for key, value in logs.items()}
