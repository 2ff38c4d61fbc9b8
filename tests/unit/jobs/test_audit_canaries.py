"""The audit's canaries: fresh ids and secret inclusion, own rows, and the step-alignment score."""

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.jobs.audit.canaries import Canaries
from sparse_dp.jobs.audit.scores import SCORES, CanaryRows, StepAlignment, canary_scores, own_rows
from sparse_dp.models.pctr import build_pctr_model


def test_canaries_have_fresh_ids_random_labels_and_secret_inclusion():
  canaries = Canaries.draw(400, [5, 7, 3], seed=1)
  x, y = canaries.inputs()
  assert x["categorical"].shape == (400, 3) and y.shape == (400, 1)
  assert (x["categorical"] >= [5, 7, 3]).all()  # above every data id
  assert all(len(set(x["categorical"][:, t])) == 400 for t in range(3))  # one row each
  assert canaries.model_vocabulary_sizes == [405, 407, 403]
  assert 150 < canaries.included.sum() < 250 and 150 < y.sum() < 250
  assert not np.array_equal(Canaries.draw(400, [5, 7, 3]).included, canaries.included)
  train = ({"integers": np.ones((10, 13), np.float32),
            "categorical": np.zeros((10, 3), np.int64)}, np.zeros((10, 1), np.float32))
  x_in, y_in = canaries.insert(train)
  assert len(y_in) == 10 + canaries.included.sum()
  np.testing.assert_array_equal(x_in["categorical"][10:], x["categorical"][canaries.included])
  train[0]["categorical"][0, 1] = 7
  with pytest.raises(ValueError, match="tables \\[1\\] reach the canaries' rows"):
    canaries.insert(train)


def test_a_row_is_a_canarys_own_only_if_nobody_else_looks_it_up():
  canary_ids = np.array([[10, 3], [11, 3], [12, 4]])
  training_ids = np.array([[0, 4], [1, 5]])
  np.testing.assert_array_equal(own_rows(canary_ids, training_ids),
                                [[True, False], [True, False], [True, False]])


@pytest.mark.slow
def test_step_alignment_reads_each_steps_update_along_each_canarys_gradient():
  canaries = Canaries.draw(8, [5, 7], seed=2)
  assert 0 < canaries.included.sum() < 8
  # 32 ReLUs: with 4 (random initialisation) all were sometimes dead for a canary (zero
  # gradient: its rows never move), which failed the last check on both stacks of a CI run.
  model = build_pctr_model(canaries.model_vocabulary_sizes, (32,), embedding_dims=[3, 3])
  rows = CanaryRows(canaries, np.zeros((1, 2), np.int64))
  x, y = canaries.inputs()
  losses, gradients = rows.loss_gradients(model)
  with tf.GradientTape() as tape:  # canary 0 alone, dense: its own rows of the tables
    loss = tf.nn.sigmoid_cross_entropy_with_logits(y[:1], model({k: v[:1] for k, v in x.items()}))
  tables = [model.get_layer(f"embedding_{t}").embeddings for t in range(2)]
  alone = [tf.convert_to_tensor(g).numpy()[x["categorical"][0, t]]
           for t, g in enumerate(tape.gradient(loss, tables))]
  alone = np.concatenate(alone)  # float32 rounding of two computations: an absolute floor
  np.testing.assert_allclose(gradients[0], alone, rtol=1e-5, atol=1e-6 * np.abs(alone).max())
  assert losses[0] == pytest.approx(float(loss[0, 0]), rel=1e-6)
  alignment = StepAlignment(rows)
  model.compile(optimizer=keras.optimizers.SGD(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  keep = canaries.included
  model.fit({k: v[keep] for k, v in x.items()}, y[keep], batch_size=8, epochs=2,
            callbacks=[alignment], verbose=0, shuffle=False)
  # Each SGD step on the mean loss moves an included canary's own rows by -0.1 g_j / B,
  # at that step's model; an excluded canary's rows stay put.
  assert len(alignment.steps) == 2
  np.testing.assert_allclose(alignment.steps[0], np.where(
      keep, 0.1 * np.linalg.norm(gradients, axis=1) / keep.sum(), 0.0), rtol=1e-4, atol=1e-9)
  assert (alignment.steps[1][keep] >= 0).all() and not alignment.score[~keep].any()
  np.testing.assert_allclose(alignment.score, alignment.steps[0] + alignment.steps[1])
  scores = canary_scores(model, rows, alignment)
  assert set(scores) == set(SCORES) and (scores["row_movement"][keep] > 0).all()
