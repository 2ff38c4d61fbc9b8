"""The DP teacher's privacy: a teacher without a DP record is refused."""

import pytest

from sparse_dp.jobs.distill import dp_teacher


def test_a_teacher_without_dp_record_is_refused():
  from sparse_dp.models.pctr import build_pctr_model
  with pytest.raises(ValueError, match="the teacher has no DP record"):
    dp_teacher.teacher_privacy(build_pctr_model([5] * 26, (4,)))


@pytest.fixture
def keyed_teacher(tmp_path):
  """A --teacher folder's files up to its model (the record checks run before the model is
  loaded) and the secrets folder of its record's key; the teacher trained on the first 90%
  of day 1's 300 synthetic examples (what --data synthetic reads)."""
  from sparse_dp.data import training_examples
  from sparse_dp.data.synthetic import SyntheticCriteo
  from sparse_dp.models.pctr_data import CriteoSplit
  private = SyntheticCriteo(scale=0.01, seed=0).write_day(tmp_path / "day_1.gz", 1, 300)
  folder, keys = tmp_path / "teacher", tmp_path / "keys"
  (folder / "model").mkdir(parents=True)
  (folder / "vocabulary.json").write_text("{}")
  training_examples.save(CriteoSplit.read([private], 300, "error").train, folder, keys)
  return private, folder, keys


def _args(*flags):
  from sparse_dp.cli import build_parser
  return build_parser().parse_args([
      "distill", "--method", "dp-teacher", "--synthetic-scale", "0.01", "--max-examples", "300",
      "--max-public-examples", "300", *flags, "--out", "r.json"])


def test_the_teachers_own_examples_are_refused_with_the_key_and_nothing_runs_without_it(
    keyed_teacher, tmp_path, monkeypatch):
  from sparse_dp.data import training_examples
  from sparse_dp.jobs.distill import pctr_inputs
  private, folder, keys = keyed_teacher
  monkeypatch.delenv(training_examples.SECRETS_ENV, raising=False)
  monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no key in the default folder
  # With the key (found by its id): the teacher's training data as public data is refused.
  args = _args("--data", str(private), "--public-data", str(private), "--teacher", str(folder))
  with pytest.raises(ValueError, match="270 of its 300 examples have the features of the "
                                       "teacher's private training examples"):
    pctr_inputs.load(args, tmp_path, recorded=training_examples.load(folder, keys))
  # Without the key: refused before the teacher is loaded, naming where to point.
  for flags in ([], ["--secrets-dir", str(tmp_path / "elsewhere")]):
    with pytest.raises(ValueError, match=r"--secrets-dir \(or \$SPARSE_DP_SECRETS_DIR\).*"
                                         r"--skip-teacher-data-check"):
      dp_teacher.run(_args("--teacher", str(folder), *flags))
  monkeypatch.setenv(training_examples.SECRETS_ENV, str(folder / "keys"))
  with pytest.raises(ValueError, match="is inside --teacher"):
    dp_teacher.run(_args("--teacher", str(folder)))
  # Skipping the check cannot be combined with public features, nor used without --teacher.
  with pytest.raises(ValueError, match="drop --features-are-public"):
    dp_teacher.run(_args("--teacher", str(folder), "--skip-teacher-data-check",
                         "--features-are-public"))
  with pytest.raises(ValueError, match="skips the check of a loaded --teacher"):
    dp_teacher.run(_args("--skip-teacher-data-check"))


def test_a_skipped_check_is_in_the_report(keyed_teacher, tmp_path):
  from sparse_dp.jobs.distill import pctr_inputs
  private, folder, _ = keyed_teacher
  args = _args("--data", str(private), "--public-data", str(private), "--teacher", str(folder),
               "--skip-teacher-data-check")
  data = pctr_inputs.load(args, tmp_path, skip_check=True)  # the teacher's own data: unchecked
  assert data.private_examples_in_public is None and data.saw_private_features is None
  assert data.teacher_data_check.startswith("skipped (--skip-teacher-data-check)")
