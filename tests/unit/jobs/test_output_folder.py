"""A job's --out: new or empty, or an earlier run's cleared by --overwrite; nothing else."""

import pytest

from sparse_dp.jobs.output_folder import RUN_MARKER, claim_output_folder, record_outputs


def test_a_new_or_empty_folder_is_claimed_and_marked(tmp_path):
  (tmp_path / "empty").mkdir()
  for folder in (tmp_path / "new" / "nested", tmp_path / "empty"):
    claim_output_folder(folder, overwrite=False, command="sparse-dp train")
    assert (folder / RUN_MARKER).read_text() == "sparse-dp train\n"
    # A run refused after the claim wrote its marker alone: the folder counts as empty.
    claim_output_folder(folder, overwrite=False, command="sparse-dp train")


def test_an_earlier_run_s_folder_needs_overwrite_which_clears_it(tmp_path):
  claim_output_folder(tmp_path, overwrite=False, command="sparse-dp train")
  (tmp_path / "metrics.json").write_text("{}")
  (tmp_path / "model").mkdir()
  (tmp_path / "model" / "saved_model.pb").write_text("")
  with pytest.raises(ValueError, match=r"already holds \.sparse-dp-run, metrics\.json, model: "
                                       r".*add --overwrite"):
    claim_output_folder(tmp_path, overwrite=False, command="sparse-dp train")
  claim_output_folder(tmp_path, overwrite=True, command="sparse-dp train")
  assert sorted(p.name for p in tmp_path.iterdir()) == [RUN_MARKER]


def test_overwrite_deletes_what_a_finished_run_wrote_and_nothing_beside_it(tmp_path):
  claim_output_folder(tmp_path, overwrite=False, command="sparse-dp train")
  (tmp_path / "metrics.json").write_text("{}")
  record_outputs(tmp_path, "sparse-dp train")
  (tmp_path / "notes.md").write_text("mine, written after the run")
  with pytest.raises(ValueError, match="holds notes.md beside the earlier run's outputs"):
    claim_output_folder(tmp_path, overwrite=True, command="sparse-dp train")
  assert sorted(p.name for p in tmp_path.iterdir()) == [RUN_MARKER, "metrics.json", "notes.md"]
  (tmp_path / "notes.md").unlink()
  claim_output_folder(tmp_path, overwrite=True, command="sparse-dp train")
  assert sorted(p.name for p in tmp_path.iterdir()) == [RUN_MARKER]


def test_a_folder_no_run_wrote_is_never_cleared(tmp_path):
  (tmp_path / "notes.txt").write_text("mine")
  for overwrite, message in ((False, "already holds notes.txt"),
                             (True, "which no sparse-dp run wrote")):
    with pytest.raises(ValueError, match=message):
      claim_output_folder(tmp_path, overwrite=overwrite, command="sparse-dp train")
  assert (tmp_path / "notes.txt").read_text() == "mine"
  with pytest.raises(ValueError, match="is a file"):
    claim_output_folder(tmp_path / "notes.txt", overwrite=True, command="sparse-dp train")


def test_the_cluster_s_workers_folder_is_left_to_the_workers(tmp_path):
  (tmp_path / "workers" / "worker_1").mkdir(parents=True)
  claim_output_folder(tmp_path, overwrite=False, command="sparse-dp train", keep=("workers",))
  (tmp_path / "metrics.json").write_text("{}")
  claim_output_folder(tmp_path, overwrite=True, command="sparse-dp train", keep=("workers",))
  assert sorted(p.name for p in tmp_path.iterdir()) == [RUN_MARKER, "workers"]
