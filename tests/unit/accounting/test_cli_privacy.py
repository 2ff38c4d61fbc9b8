"""``sparse-dp privacy`` agrees with dp_accounting and rejects bad flags in one line."""

import json
import pathlib
import subprocess
import sys

import dp_accounting
import pytest
from dp_accounting import pld

from sparse_dp.accounting.adafest_defaults import adafest_settings
from sparse_dp.cli import main

N, B, STEPS = 500_000, 1000, 2000
COMMON = ["--num-examples", str(N), "--batch-size", str(B), "--steps", str(STEPS)]


def run_json(capsys, *flags):
  assert main(["privacy", *COMMON, *flags, "--json"]) == 0
  return json.loads(capsys.readouterr().out)


def reference_epsilon(sigma, delta=1 / N):
  event = dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(B / N, dp_accounting.GaussianDpEvent(sigma)), STEPS)
  return pld.PLDAccountant().compose(event).get_epsilon(delta)


def test_dpsgd(capsys):
  out = run_json(capsys, "--algorithm", "dpsgd", "--noise-multiplier", "1.0")
  assert out["epsilon"] == pytest.approx(reference_epsilon(1.0), rel=0.01)
  assert out["delta"] == pytest.approx(1 / N)
  assert out["steps"] == STEPS and out["sampling_rate"] == pytest.approx(B / N)
  assert out["accountant"] == "pld" and out["noise_multiplier"] == 1.0


def test_adafest(capsys):
  out = run_json(capsys, "--algorithm", "adafest", "--sigma1", "4", "--sigma2", "0.9")
  sigma = (4 ** -2 + 0.9 ** -2) ** -0.5
  assert out["effective_noise_multiplier"] == pytest.approx(sigma)
  assert out["epsilon"] == pytest.approx(reference_epsilon(sigma), rel=0.01)
  assert (out["sigma1"], out["sigma2"]) == (4.0, 0.9)


def test_fest(capsys):
  out = run_json(capsys, "--algorithm", "fest", "--noise-multiplier", "1.2",
                 "--fest-epsilon", "0.05", "--delta", "1e-7")
  assert out["epsilon"] == pytest.approx(0.05 + reference_epsilon(1.2, 1e-7), rel=0.01)


def test_target_epsilon_for_adafest(capsys):
  out = run_json(capsys, "--algorithm", "adafest", "--target-epsilon", "2", "--sigma-ratio", "3")
  assert out["sigma1"] / out["sigma2"] == pytest.approx(3)
  assert 0.98 * 2 <= reference_epsilon(out["effective_noise_multiplier"]) <= 2


def test_table_rows_give_the_split_and_threshold_of_the_rule(capsys):
  rows = [82_743, 60_000, 40_000]
  out = run_json(capsys, "--algorithm", "adafest", "--target-epsilon", "2", "--table-rows",
                 *map(str, rows))
  rule = adafest_settings(rows, B)
  assert out["sigma1"] / out["sigma2"] == pytest.approx(rule.sigma_ratio)
  assert out["threshold_sigmas"] == pytest.approx(rule.threshold_sigmas)
  paper = run_json(capsys, "--algorithm", "adafest", "--target-epsilon", "2")
  assert paper["sigma1"] / paper["sigma2"] == pytest.approx(5.0) and "threshold_sigmas" not in paper
  assert out["effective_noise_multiplier"] == pytest.approx(paper["effective_noise_multiplier"])
  given = run_json(capsys, "--algorithm", "adafest", "--target-epsilon", "2", "--table-rows",
                   "1000", "--sigma-ratio", "3")
  assert given["sigma1"] / given["sigma2"] == pytest.approx(3.0)
  assert main(["privacy", *COMMON, "--algorithm", "adafest", "--target-epsilon", "2",
               "--table-rows", "1000"]) == 0
  text = capsys.readouterr().out.splitlines()
  noise = next(i for i, line in enumerate(text) if line.startswith("  Noise:"))
  assert text[noise + 1].startswith("  Threshold: tau = ")


def test_epochs_and_statement(capsys):
  assert main(["privacy", "--algorithm", "dpsgd", "--num-examples", "60000",
               "--batch-size", "256", "--epochs", "2", "--noise-multiplier", "1.1"]) == 0
  text = capsys.readouterr().out
  assert "469 steps" in text and "Poisson sampling" in text and "-DP" in text


@pytest.mark.parametrize("flags,message", [
    (["--algorithm", "dpsgd", "--noise-multiplier", "-1"], "noise multiplier must be"),
    (["--algorithm", "dpsgd", "--noise-multiplier", "1", "--batch-size", str(2 * N)], "q = B/N"),
    (["--algorithm", "dpsgd", "--target-epsilon", "1e-5"], "needs a noise multiplier above"),
    (["--algorithm", "dpsgd", "--target-epsilon", "1e5"], "such a target protects nothing"),
    (["--algorithm", "adafest+", "--target-epsilon", "0.01", "--fest-epsilon", "0.01"],
     "leaves nothing for training"),
    (["--algorithm", "dpsgd"], "needs --noise-multiplier"),
    (["--algorithm", "fest", "--noise-multiplier", "1"], "needs --fest-epsilon"),
    (["--algorithm", "adafest", "--noise-multiplier", "1"], "does not apply"),
    (["--algorithm", "dpsgd", "--noise-multiplier", "1", "--target-epsilon", "1"], "not both"),
    (["--algorithm", "adafest", "--target-epsilon", "1", "--table-rows", "0"], "must be > 0"),
    (["--algorithm", "adafest", "--target-epsilon", "1", "--sigma-ratio", "0"],
     "--sigma-ratio (sigma1/sigma2) must be"),
    (["--algorithm", "adafest", "--sigma1", "1", "--sigma2", "1", "--table-rows", "9"],
     "--table-rows only applies"),
    (["--algorithm", "dpsgd", "--target-epsilon", "1", "--table-rows", "9"],
     "--table-rows only applies"),
])
def test_bad_flags_exit_nonzero_with_one_line(capsys, flags, message):
  assert main(["privacy", *COMMON, *flags]) != 0
  err = capsys.readouterr().err
  assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_installed_command_runs_from_any_folder(tmp_path):
  command = pathlib.Path(sys.executable).with_name("sparse-dp")
  if not command.exists():
    pytest.skip("sparse-dp is not installed next to this Python (run from an installed venv)")
  result = subprocess.run([str(command), "privacy", *COMMON, "--algorithm", "dpsgd",
                           "--noise-multiplier", "1.0", "--json"], cwd=tmp_path,
                          capture_output=True, text=True, check=True)
  assert json.loads(result.stdout)["epsilon"] == pytest.approx(reference_epsilon(1.0), rel=0.01)
  bad = subprocess.run([str(command), "privacy", "--algorithm", "dpsgd"], cwd=tmp_path,
                       capture_output=True, text=True)
  assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_delta_at_least_one_over_n_is_warned_in_one_line(capsys):
  out = run_json(capsys, "--algorithm", "dpsgd", "--noise-multiplier", "1.0",
                 "--delta", str(2 / N))
  assert out["delta"] == pytest.approx(2 / N)
  assert main(["privacy", *COMMON, "--algorithm", "dpsgd", "--noise-multiplier", "1.0",
               "--delta", str(2 / N)]) == 0
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "4e-06" in err[0] and "1/N = 2e-06" in err[0]
  run_json(capsys, "--algorithm", "dpsgd", "--noise-multiplier", "1.0", "--delta", "1e-9")
  assert capsys.readouterr().err == ""


SMALL_NOISE = ["privacy", "--algorithm", "dpsgd", "--num-examples", "1000000",
               "--batch-size", "100000", "--steps", "1000", "--noise-multiplier", "0.15"]


@pytest.mark.slow
def test_small_noise_pld_fits_in_memory_and_says_so(capsys):
  # At dp_accounting's default grid (1e-4) this PLD peaks at 2.5 GB; the grid
  # is widened to fit in ~360 MB, still a pessimistic upper bound.
  # The peak is read from VmHWM, this process's own memory: ru_maxrss also counts
  # the parent's (pytest's, with TensorFlow) resident memory at the fork.
  script = ("import json, re\n"
            "from sparse_dp.accounting import BatchSchedule, PrivacyReport, PrivacySpec\n"
            "spec = PrivacySpec('dpsgd', BatchSchedule.constant(0.1, 1000),"
            " noise_multiplier=0.15)\n"
            "epsilon = PrivacyReport.compute(spec, 1e-6).epsilon\n"
            "status = open('/proc/self/status').read()\n"
            "print(json.dumps([epsilon, int(re.search(r'VmHWM:\\s+(\\d+) kB', status)[1])]))")
  epsilon, peak_kb = json.loads(subprocess.run([sys.executable, "-c", script], check=True,
                                               capture_output=True, text=True).stdout)
  assert peak_kb < 800 * 1024, f"peak memory {peak_kb / 1024:.0f} MB"
  event = dp_accounting.SelfComposedDpEvent(
      dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(0.15)), 1000)
  reference = pld.PLDAccountant(value_discretization_interval=1e-3).compose(event).get_epsilon(1e-6)
  assert epsilon == pytest.approx(reference, rel=1e-3)
  assert main([*SMALL_NOISE, "--json"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["accountant"] == "pld" and "fits in memory" in out["note"]
  assert out["epsilon"] == pytest.approx(epsilon, rel=1e-12)
