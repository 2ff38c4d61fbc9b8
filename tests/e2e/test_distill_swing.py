"""``sparse-dp distill --method swing``: the report (sizes, no epsilon, exposure) and refusals."""

import json

import numpy as np
import pytest

from sparse_dp.jobs.distill.swing.model import NextItemModelSpec

TINY = ["--swing-items", "100", "--swing-history", "3", "--swing-teacher-examples", "1500",
        "--swing-student-examples", "200", "--swing-test-examples", "300",
        "--swing-clue-items", "3", "--swing-canaries", "6", "--swing-canary-repeats", "5",
        "--swing-teacher-dim", "16", "--swing-teacher-hidden", "32",
        "--swing-student-dim", "4", "--swing-student-hidden", "8",
        "--swing-student-buckets", "30", "--swing-teacher-epochs", "2",
        "--swing-student-epochs", "2", "--swing-batch-size", "128"]


@pytest.mark.slow
def test_distill_swing_writes_the_report(tmp_path):
  from sparse_dp.cli import main
  out = tmp_path / "swing.json"
  assert main(["distill", "--method", "swing", *TINY, "--out", str(out)]) == 0
  report = json.loads(out.read_text())
  assert report["method"] == "swing"
  teacher = NextItemModelSpec(100, 3, 16, 32).trainable_parameters()
  student = NextItemModelSpec(100, 3, 4, 8, 30).trainable_parameters()
  assert (report["teacher_parameters"], report["student_parameters"]) == (teacher, student)
  assert report["compression_ratio"] == pytest.approx(teacher / student)
  assert report["speedup"] == pytest.approx(
      report["student_examples_per_second"] / report["teacher_examples_per_second"])
  assert report["epsilon"] is None and report["delta"] is None
  assert "no differential privacy guarantee" in report["epsilon_reason"]
  # Caveats at the top: no epsilon, and the noise's seed is fixed (--swing-seed).
  assert list(report)[:2] == ["method", "caveats"]
  assert report["caveats"][0].startswith("no epsilon") and len(report["caveats"]) == 2
  assert "--swing-seed (0)" in report["caveats"][1]
  assert set(report["models"]) == {"teacher", "student_alone", "kd", "swing"}
  assert report["student_accuracy"] == report["models"]["swing"]["accuracy"]
  for model in report["models"].values():
    assert 0 <= model["accuracy"]["top1"] <= model["accuracy"]["top10"] <= 1
    exposure = model["canary_exposure"]
    assert exposure["canaries"] == 6 and exposure["clued"]["canaries"] == 3
    assert 0 <= exposure["mean_exposure"] <= report["max_exposure"] == pytest.approx(
        np.log2(100))


def test_distill_swing_refuses_bad_input(tmp_path, capsys):
  from sparse_dp.cli import main
  out = str(tmp_path / "swing.json")
  assert main(["distill", "--method", "swing", *TINY, "--swing-alpha", "2", "--out", out]) == 2
  assert "--swing-alpha must be in [0, 1]" in capsys.readouterr().err
  assert main(["distill", "--method", "swing", *TINY, "--swing-student-hidden", "64",
               "--swing-student-dim", "64", "--out", out]) == 2
  assert "must be smaller than the teacher" in capsys.readouterr().err
