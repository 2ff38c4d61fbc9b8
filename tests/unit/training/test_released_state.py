"""What a private model releases carries no un-noised statistic of its training data.

A TFRS task updates its metrics (``task/_ranking_metrics/.../total``,
``count``: sums of the labels' errors) in ``compute_loss``. The DP step
computes each example's loss with the metrics frozen, so after private
training they hold nothing from the private data, in memory and in every
saved form; with ``debug_metrics=True`` (marked in the privacy report as not
covered by epsilon) they are updated from the batch as in plain Keras.
"""

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras

from support.keras_models import N, synthetic_data
from support.tfrs_models import RankingModel


def metric_values(model) -> dict:
  return {v.name: v.numpy() for m in model.submodules if isinstance(m, keras.metrics.Metric)
          for v in m.variables}


def saved_metric_values(prefix: str) -> list:
  return [tf.train.load_variable(prefix, name) for name, _ in tf.train.list_variables(prefix)
          if "metric" in name and "OPTIMIZER_SLOT" not in name]


@pytest.mark.parametrize("debug", [False, True])
def test_task_metrics_hold_nothing_of_the_private_data_in_every_saved_form(debug, tmp_path):
  keras.utils.set_random_seed(4)
  ids, labels = synthetic_data()
  model = RankingModel(keras.losses.Reduction.NONE)
  model.compile(optimizer=keras.optimizers.Adagrad(0.3))
  model.compute_loss((ids[:2], labels[:2]))  # builds it (and updates its metrics once)
  for metric in (m for m in model.submodules if isinstance(m, keras.metrics.Metric)):
    metric.reset_state()
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig("adafest", noise_seed=1, sigma1=3.0, sigma2=0.8, threshold=3.0,
                                debug_metrics=debug),
      num_examples=N, batch_size=256)
  model.fit(private.poisson_dataset(ids, labels, epochs=1), verbose=0)
  assert int(private.steps_taken.numpy()) > 0
  values = metric_values(model)
  assert values  # the task's accumulators exist
  if debug:  # un-noised, as the report says (the same accumulators are saved as without it)
    assert any(np.any(v != 0) for v in values.values())
    return
  model.save_weights(str(tmp_path / "weights"))
  tf.train.Checkpoint(model=model).write(str(tmp_path / "checkpoint"))
  model.save(str(tmp_path / "saved_model"))
  saved = [*saved_metric_values(str(tmp_path / "weights")),
           *saved_metric_values(str(tmp_path / "checkpoint")),
           *saved_metric_values(str(tmp_path / "saved_model" / "variables" / "variables"))]
  assert saved  # the accumulators are written by every format
  assert all(np.all(v == 0) for v in values.values())
  assert all(np.all(np.asarray(v) == 0) for v in saved)
