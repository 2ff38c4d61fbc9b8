"""The privacy fields of ``sparse-dp distill`` reports: label replacement, caveats, noise seeds."""

import math

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld

from sparse_dp.cli import build_parser
from sparse_dp.jobs.distill import dp_teacher, privacy_fields
from sparse_dp.training.dp_state.dp_record import Record, Run
from sparse_dp.training.dp_state.provenance import fingerprinted_variables
from sparse_dp.training.dp_state.state import attach
from sparse_dp.training.dp_state.weight_fingerprint import Fingerprint, WeightsMovedOutsideDPError


def _gaussian_epsilon(sigma: float, sensitivity: float, delta: float) -> float:
  return pld.from_gaussian_mechanism(sigma, sensitivity=sensitivity).get_epsilon_for_delta(delta)


@pytest.mark.parametrize("sigma", [0.8, 2.0, 5.0])
def test_label_replacement_is_group_privacy_of_two(sigma):
  """On a Gaussian sum of clipped contributions (add/remove sensitivity 1), changing one
  example's label moves the sum by up to 2: its true replacement epsilon exceeds the
  add/remove one (so reporting that for labels was wrong) and is within the group bound."""
  delta = 1e-5
  epsilon = _gaussian_epsilon(sigma, 1.0, delta)
  replaced_epsilon, replaced_delta = privacy_fields.label_replacement(epsilon, delta)
  assert (replaced_epsilon, replaced_delta) == (2 * epsilon, (1 + math.exp(epsilon)) * delta)
  assert _gaussian_epsilon(sigma, 2.0, delta) > 1.3 * epsilon
  assert _gaussian_epsilon(sigma, 2.0, replaced_delta) <= replaced_epsilon


def _teacher(non_poisson_steps: int = 0, debug_metrics: bool = False):
  """A pCTR model whose dp_record says it took 10 DP-SGD steps."""
  from sparse_dp.models.pctr import build_pctr_model
  model = build_pctr_model([5] * 26, (4,))
  state = attach(model)
  state.set_record(Record(
      (Run("dpsgd", 1.2, 0.01, 0, 10_000, 1e-5, debug_metrics=debug_metrics),), 10,
      non_poisson_steps))
  state.bind(Fingerprint(fingerprinted_variables(model), state.weight_fingerprint))
  return model


def test_a_teacher_whose_record_is_bound_to_no_weights_is_refused():
  model = _teacher()
  model.get_layer("logit").bias.assign_add([1.0])
  with pytest.raises(WeightsMovedOutsideDPError):
    dp_teacher.teacher_privacy(model)


def test_a_poisson_teacher_distilled_on_public_data_reports_add_remove():
  privacy = dp_teacher.teacher_privacy(_teacher())
  fields = dp_teacher.privacy_report(privacy, private_examples_in_public=0)
  assert fields["epsilon"] == privacy["epsilon"] > 0 and fields["delta"] == 1e-5
  assert fields["adjacency"] == privacy_fields.ADD_REMOVE and fields["post_processing"]
  assert fields["caveats"] == [] and "epsilon_not_poisson" not in fields


def test_labels_only_coverage_is_reported_as_replacement():
  privacy = dp_teacher.teacher_privacy(_teacher())
  fields = dp_teacher.privacy_report(privacy, private_examples_in_public=270)
  epsilon, delta = privacy["epsilon"], privacy["delta"]
  assert fields["epsilon"] == pytest.approx(2 * epsilon)
  assert fields["delta"] == pytest.approx((1 + math.exp(epsilon)) * delta)
  assert fields["adjacency"] == privacy_fields.LABEL_REPLACEMENT
  assert fields["post_processing"] is False
  assert "(2 epsilon, (1 + e^epsilon) delta)" in fields["epsilon_covers"]
  assert (fields["teacher"]["epsilon"], fields["teacher"]["delta"]) == (epsilon, delta)
  assert fields["teacher"]["adjacency"] == privacy_fields.ADD_REMOVE
  (caveat,) = fields["caveats"]
  assert "270 of the teacher's private training examples" in caveat


def test_a_skipped_teacher_data_check_is_a_caveat_and_claims_no_post_processing():
  privacy = dp_teacher.teacher_privacy(_teacher())
  fields = dp_teacher.privacy_report(privacy, private_examples_in_public=None)
  assert fields["epsilon"] == privacy["epsilon"]
  assert fields["adjacency"] == privacy_fields.ADD_REMOVE
  assert fields["post_processing"] is None  # unknown: nothing compared the inputs
  assert fields["caveats"] == [dp_teacher.CHECK_SKIPPED]
  assert "--skip-teacher-data-check" in fields["caveats"][0]
  assert fields["epsilon_covers"].startswith("only if --public-data holds none")


def test_a_non_poisson_teacher_prints_no_bare_epsilon_and_keeps_every_caveat():
  privacy = dp_teacher.teacher_privacy(_teacher(non_poisson_steps=4, debug_metrics=True))
  fields = dp_teacher.privacy_report(privacy, private_examples_in_public=5)
  for where in (fields, fields["teacher"]):
    assert where["epsilon"] is None and where["epsilon_not_poisson"] > 0
  assert fields["epsilon_not_poisson"] == pytest.approx(2 * privacy["epsilon"])
  caveats = fields["caveats"]
  assert len(caveats) == 3
  assert caveats[0].startswith("NOT a proved epsilon") and "4 steps" in caveats[0]
  assert "debug_metrics" in caveats[1] and "features are not protected" in caveats[2]


def test_a_fixed_noise_seed_always_carries_its_caveat(tmp_path):
  assert privacy_fields.fixed_noise_seed(None, "x") == []
  (caveat,) = privacy_fields.fixed_noise_seed(0, "the teacher's answers")
  assert "fixed seed (0)" in caveat and "the teacher's answers" in caveat
  # A loaded teacher's noise is its own: --noise-seed beside --teacher is refused.
  args = build_parser().parse_args(["distill", "--method", "dp-teacher", "--teacher",
                                    str(tmp_path), "--noise-seed", "3", "--out", "r.json"])
  with pytest.raises(ValueError, match="drop --noise-seed"):
    dp_teacher.run(args)
