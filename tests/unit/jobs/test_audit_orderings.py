"""The audit's orderings of its runs against their claims, and a broken run's true epsilon."""

import pytest

from sparse_dp.jobs.audit.audit_command import orderings
from sparse_dp.jobs.audit.audit_job import true_epsilon


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
