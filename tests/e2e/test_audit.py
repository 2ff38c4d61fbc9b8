"""``sparse-dp audit``: the broken mechanism's switch, refused flags, a small audit's orderings."""

import json
import shlex

import pytest

from sparse_dp.cli import build_parser, main
from sparse_dp.jobs.audit.audit_job import audit_power, true_epsilon
from sparse_dp.jobs.audit.scores import SCORES
from sparse_dp.jobs.audit.testing import noise_scaled_for_testing
from sparse_dp.training.dp_step.step import StepNoise
from sparse_dp.training.wrappers import entry_point

from support.stacks import one_stack


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
