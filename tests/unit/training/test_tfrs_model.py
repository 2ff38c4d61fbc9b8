"""A subclassed tfrs.Model trains privately (its own train_step sums gradients)."""

import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras

from support.keras_models import N, synthetic_data
from support.tfrs_models import RankingModel


def test_tfrs_model_trains_with_adafest():
  keras.utils.set_random_seed(4)
  ids, labels = synthetic_data()
  model = RankingModel(keras.losses.Reduction.NONE)
  model.compile(optimizer=keras.optimizers.Adagrad(0.3))
  before = float(tf.reduce_mean(model.compute_loss((ids, labels))))
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig("adafest", noise_seed=1, sigma1=3.0, sigma2=0.8, threshold=3.0),
      num_examples=N, batch_size=256)
  history = model.fit(private.poisson_dataset(ids, labels, epochs=3), verbose=0,
                      callbacks=[private.callback()])
  assert float(tf.reduce_mean(model.compute_loss((ids, labels)))) < before - 0.1
  assert history.history["epsilon"][-1] > 0
  # The task's metrics and loss are un-noised functions of the batch: not logged by default.
  assert not {"binary_accuracy", "loss"} & set(history.history)
  # evaluate logs the mean of the task's per-example loss, with a last, smaller batch too;
  # it returns the last batch's, as a tfrs.Model with the task's default reduction does.
  test = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(1000)  # 4 x 1000, then 96
  logs = model.evaluate(test, verbose=1, return_dict=True)
  last = float(tf.reduce_mean(model.compute_loss((ids[4000:], labels[4000:]))))
  assert logs["loss"] == pytest.approx(last, rel=1e-4)


def test_tfrs_model_with_reduced_loss_is_refused_clearly():
  ids, labels = synthetic_data()
  model = RankingModel(keras.losses.Reduction.SUM)
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.1))
  model.compute_loss((ids[:2], labels[:2]))  # builds it
  sparse_dp.make_private(model, sparse_dp.DPConfig("dpsgd", noise_seed=1, noise_multiplier=1.0),
                         num_examples=N, batch_size=256)
  with pytest.raises(ValueError, match="reduction=keras.losses.Reduction.NONE"):
    model.fit(tf.data.Dataset.from_tensor_slices((ids, labels)).batch(256), verbose=0)
