"""``sparse-dp audit``: canaries, the broken mechanism's switch, and a small audit's orderings."""

import json
import shlex

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.cli import build_parser, main
from sparse_dp.jobs.audit.audit_command import orderings
from sparse_dp.jobs.audit.audit_job import audit_power, true_epsilon
from sparse_dp.jobs.audit.canaries import Canaries
from sparse_dp.jobs.audit.scores import SCORES, CanaryRows, StepAlignment, canary_scores, own_rows
from sparse_dp.jobs.audit.testing import noise_scaled_for_testing
from sparse_dp.models.pctr import build_pctr_model
from sparse_dp.training.dp_step.step import StepNoise
from sparse_dp.training.wrappers import entry_point

from support.stacks import one_stack


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


def test_the_broken_mechanism_switch_scales_the_noise_and_is_scoped():
  assert entry_point.StepNoise is StepNoise
  fields = dict(gradient_multiplier=1.5, contribution_multiplier=2.0, l2_norm_clip=1.0,
                contribution_clip=1.0, threshold=3.0, expected_batch_size=8.0)
  with pytest.raises(RuntimeError, match="boom"):
    with noise_scaled_for_testing(0.25):
      noise = entry_point.StepNoise(**fields)
      assert (noise.gradient_multiplier, noise.contribution_multiplier) == (0.375, 0.5)
      assert entry_point.StepNoise(**{**fields, "contribution_multiplier": None}
                              ).contribution_multiplier is None
      with pytest.raises(RuntimeError, match="already active"):
        with noise_scaled_for_testing(0.0):
          pass
      raise RuntimeError("boom")
  assert entry_point.StepNoise is StepNoise  # restored after an error
  with noise_scaled_for_testing(0.0):
    assert entry_point.StepNoise(**fields).gradient_multiplier == 0.0
  for scale in (1.0, -0.5):
    with pytest.raises(ValueError, match="in \\[0, 1\\)"):
      with noise_scaled_for_testing(scale):
        pass
  parser = build_parser()
  for command in (["train"], ["stream"], ["audit"]):
    with pytest.raises(SystemExit):
      parser.parse_args(command + ["--broken-mechanism-for-testing", "none"])
  assert parser.parse_args(["audit", "--broken-mechanism-for-testing", "dpsgd"]
                           ).broken_mechanism_for_testing == "dpsgd"


def test_orderings_grade_every_broken_run_and_the_accountant_gives_its_true_epsilon():
  def run(noise_scale, claim, bound):
    return {"noise_scale": noise_scale, "claimed_epsilon": claim, "epsilon_lower_bound": bound,
            "private_run": noise_scale == 1.0 and claim is not None,
            "flagged": claim is not None and bound > claim}
  checks = orderings([run(1.0, None, 3.0), run(1.0, 1.0, 0.0), run(0.0, 1.0, 2.0),
                      run(0.25, 1.0, 1.5), run(0.5, 1.0, 0.4)])
  assert checks == {"positive_control_above_claims": True,
                    "broken_mechanisms_above_claim": {"noise x0": True, "noise x0.25": True,
                                                      "noise x0.5": False},
                    "private_runs_below_claims": True}
  # DP-SGD at noise 1.7 for 16 steps of q = 64 / 963 claims 1.0 (the smoke audit's run); at
  # half the noise the accountant gives 4.16; DP-AdaFEST's two noises compose into one.
  adafest = {"noise_multipliers": {"sigma1": 1.6952568847296583, "sigma2": 1e9}, "steps": 16,
             "train_examples": 963, "selection_epsilon": 0.1}
  assert true_epsilon(adafest, 0.5, 64, 1e-6) == pytest.approx(4.16 + 0.1, abs=0.01)
  assert true_epsilon(adafest, 0.0, 64, 1e-6) is None


@pytest.mark.parametrize("flags,message", [
    (["--algorithms", "none,dpsgdd"], "unknown ['dpsgdd']"),
    (["--canaries", "1"], "--canaries must be >= 2"),
    (["--confidence", "1"], "--confidence must be in (0, 1)"),
    (["--broken-noise-scales", "0.5,1"], "--broken-noise-scales '0.5,1': give distinct")])
def test_bad_audit_flags_are_refused_by_name(flags, message, tmp_path, capsys):
  assert main(["audit", "--out", str(tmp_path)] + flags) == 2
  assert message in capsys.readouterr().err
  assert not (tmp_path / "audit.json").exists()


@pytest.mark.slow
@one_stack("tf2.21")  # an end-to-end run; its library code has unit tests on both stacks
def test_small_audit_shows_the_orderings_and_its_power(tmp_path, capsys):
  argv = ["audit", "--preset", "smoke", "--algorithms", "none,dpsgd", "--canary-seed", "3",
          "--noise-seed", "4", "--broken-mechanism-for-testing", "dpsgd",
          "--broken-noise-scales", "0", "--out", str(tmp_path), "--json"]
  assert main(argv) == 0
  captured = capsys.readouterr()
  report = json.loads(captured.out)
  assert report == json.loads((tmp_path / "audit.json").read_text())
  assert vars(build_parser().parse_args(shlex.split(report["command"])[1:])) == vars(
      build_parser().parse_args(argv))  # the command repeats the audit
  assert report["checks"] == {"positive_control_above_claims": True,
                              "broken_mechanisms_above_claim": {"noise x0": True},
                              "private_runs_below_claims": True}
  none, dpsgd, broken = report["results"]
  assert (none["algorithm"], none["claimed_epsilon"], none["private_run"]) == ("none", None, False)
  assert dpsgd["private_run"] and 0.9 < dpsgd["claimed_epsilon"] <= 1.0
  assert dpsgd["true_epsilon"] == dpsgd["claimed_epsilon"] and not dpsgd["flagged"]
  assert true_epsilon(dpsgd, 1.0, 64, dpsgd["delta"]) == pytest.approx(dpsgd["claimed_epsilon"])
  assert broken["algorithm"] == "dpsgd" and not broken["private_run"] and broken["flagged"]
  assert broken["mechanism"] == "broken for testing: noise off" and broken["true_epsilon"] is None
  assert none["epsilon_lower_bound"] > 2.0 and broken["epsilon_lower_bound"] > 1.0
  # DP-SGD's noise moves every row, the broken run's moves only the sampled canaries'.
  assert dpsgd["rows_moved"]["excluded"] == 1.0 and broken["rows_moved"]["excluded"] == 0.0
  # Every step is observed; the non-private run shows each included canary along its gradient.
  assert none["white_box"]["epsilon_lower_bound"] > none["black_box"]["epsilon_lower_bound"]
  assert none["exposure"]["step_alignment"]["mean"] > 2 * dpsgd["exposure"]["step_alignment"][
      "mean"]
  power = audit_power(1.0, 128, 1e-6, 0.05)
  for result in report["results"]:
    assert result["canaries"] == 128 and result["confidence"] == pytest.approx(0.95)
    assert result["delta"] == 1e-6 and result["tries"] == 21
    assert result["steps_observed"] == result["steps"] > 0
    for side in ("white_box", "black_box"):
      assert result[side]["correct"] <= result[side]["guesses"]
      assert result[side]["epsilon_lower_bound"] <= result["epsilon_lower_bound"]
    assert result["black_box"]["score"] == "loss"
    assert set(result["exposure"]) == set(SCORES)
  assert none["power"] == power and 5 < power["smallest_epsilon_flagged"] < 15
  assert dpsgd["power"]["claim"] == dpsgd["claimed_epsilon"]
  assert "the audit flags a true epsilon >=" in captured.err
  assert none["exposure"]["loss"]["mean"] > 2 * dpsgd["exposure"]["loss"]["mean"]
