"""A study run's cache key across the threshold rule (sparse_dp.accounting.adafest_defaults)."""

from sparse_dp.jobs.study.runner import runs
from sparse_dp.jobs.train.job_flags import FitSettings


def test_a_setting_left_to_the_rule_is_keyed_as_the_default_cached_runs_trained_with():
  key = runs._settings_key(FitSettings())  # a DP-SGD run's key is the one it always had
  assert (key["sigma_ratio"], key["tau_sigmas"]) == (2.0, 4.0)
  assert runs._settings_key(FitSettings(sigma_ratio=5.0))["sigma_ratio"] == 5.0


def test_only_a_run_that_takes_a_value_from_the_rule_carries_the_rule_in_its_key():
  assert not runs.uses_adafest_rule(FitSettings(), "dpsgd")
  assert runs.uses_adafest_rule(FitSettings(), "adafest")
  assert runs.uses_adafest_rule(FitSettings(tau_sigmas=4.0), "adafest+")  # its ratio
  assert runs.uses_adafest_rule(FitSettings(sigma_ratio=2.0), "adafest")  # its threshold
  assert not runs.uses_adafest_rule(FitSettings(tau=5.0, sigma_ratio=2.0), "adafest")
  assert not runs.uses_adafest_rule(FitSettings(tau_sigmas=4.0, sigma_ratio=2.0), "adafest")
