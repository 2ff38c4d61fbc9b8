"""A teacher's record of its training examples: keyed hashes of their features, the key kept
outside the folder, so the folder alone cannot tell whether an example was trained on."""

import json
import stat

import numpy as np
import pandas as pd
import pytest

from sparse_dp.cli import main
from sparse_dp.data import training_examples
from sparse_dp.data.criteo import CriteoReader
from sparse_dp.data.criteo_format import CATEGORICAL_NAMES, INTEGER_NAMES
from sparse_dp.data.synthetic import SyntheticCriteo


@pytest.fixture(scope="module")
def days(tmp_path_factory):
  """Two synthetic days, 200 examples each: the teacher's training examples and others."""
  root = tmp_path_factory.mktemp("days")
  synthetic = SyntheticCriteo(scale=0.01, seed=0)
  return [CriteoReader([synthetic.write_day(root / f"day_{day}.gz", day, 200)]).read_all()
          for day in (1, 2)]


def test_the_record_is_the_training_examples_features(tmp_path):
  frame = CriteoReader([SyntheticCriteo(scale=0.01).write_day(
      tmp_path / "day.gz", 1, 50)]).read_all()
  hashes = training_examples.feature_hashes(frame)
  assert hashes.dtype == np.uint64 and len(np.unique(hashes)) == 50
  changed = frame.copy()
  changed.loc[7, "label"] = 1 - changed.loc[7, "label"]
  assert np.array_equal(training_examples.feature_hashes(changed), hashes)  # label left out
  changed.loc[3, CATEGORICAL_NAMES[-1]] = "0badcafe"
  changed.loc[5, INTEGER_NAMES[0]] = -7.0  # Criteo's integers here are >= 0 or missing
  assert list(np.flatnonzero(training_examples.feature_hashes(changed) != hashes)) == [3, 5]


def test_the_folder_holds_nothing_that_tests_membership_without_the_key(days, tmp_path):
  """The unkeyed record of earlier versions (an example's content hash, which anyone with
  the data recomputes) gave a membership test of TPR 1 at FPR 0: no unkeyed hash of an
  example, nor the key, is in the folder now, and a wrong key matches nothing."""
  trained, other = days
  folder, keys = tmp_path / "out", tmp_path / "keys"
  folder.mkdir()
  key_path = training_examples.save(trained, folder, keys)
  assert sorted(p.name for p in folder.iterdir()) == sorted(
      [training_examples.FILE, training_examples.KEY_ID_FILE])
  # The key: outside the folder, readable by its owner only, named by its id (not the key).
  assert key_path.parent == keys and stat.S_IMODE(key_path.stat().st_mode) == 0o600
  assert stat.S_IMODE(keys.stat().st_mode) == 0o700
  key = bytes.fromhex(key_path.read_text())
  identifier = json.loads((folder / training_examples.KEY_ID_FILE).read_text())["key_id"]
  assert key_path.name == f"{identifier}.key" and identifier == training_examples.key_id(key)
  written = b"".join(p.read_bytes() for p in folder.iterdir())
  assert key not in written and key.hex().encode() not in written
  # No unkeyed hash of a training example, in any byte order or alignment.
  hashes = np.load(folder / training_examples.FILE)
  unkeyed = training_examples.feature_hashes(trained)
  assert not np.isin(unkeyed, hashes).any()
  assert not any(h.tobytes() in written or h.byteswap().tobytes() in written for h in unkeyed)
  # One value per training example (their number is metrics.json's train_examples), pseudorandom.
  assert hashes.dtype == np.uint64 and len(np.unique(hashes)) == len(trained)
  # A wrong key tests nothing: no training example matches, as no other example does.
  wrong = training_examples.Record(bytes(32), hashes)
  assert wrong.count_in(trained) == 0 and wrong.count_in(other) == 0
  # The right key, found by its id, finds every training example and no other.
  record = training_examples.load(folder, keys)
  assert record.count_in(trained) == len(trained) and record.count_in(other) == 0
  assert record.count_in(pd.concat([other[:30], trained[:20]])) == 20


def test_duplicate_examples_are_hashed_apart(days, tmp_path):
  trained, _ = days
  doubled = pd.concat([trained[:10], trained[:10], trained[10:40]], ignore_index=True)
  folder = tmp_path / "out"
  folder.mkdir()
  training_examples.save(doubled, folder, tmp_path / "keys")
  hashes = np.load(folder / training_examples.FILE)
  assert len(np.unique(hashes)) == len(doubled) == 50  # equal values would show duplicates
  assert training_examples.load(folder, tmp_path / "keys").count_in(trained[:10]) == 10


def test_a_record_without_its_key_or_an_unkeyed_one_is_refused(days, tmp_path):
  trained, _ = days
  folder, keys = tmp_path / "out", tmp_path / "keys"
  folder.mkdir()
  with pytest.raises(ValueError, match="no record of its training examples"):
    training_examples.load(folder, keys)
  training_examples.save(trained, folder, keys)
  with pytest.raises(ValueError, match=r"is not in .*--secrets-dir.*SPARSE_DP_SECRETS_DIR.*"
                                       r"--skip-teacher-data-check"):
    training_examples.load(folder, tmp_path / "elsewhere")
  # An earlier version's unkeyed record: refused, saying to delete it and retrain.
  np.save(folder / training_examples.LEGACY_FILE,
          np.unique(training_examples.feature_hashes(trained)))
  with pytest.raises(ValueError, match=r"unkeyed hash.*Delete .*retrain"):
    training_examples.load(folder, keys)
  # A new record in that folder replaces it.
  training_examples.save(trained, folder, keys)
  assert not (folder / training_examples.LEGACY_FILE).exists()
  assert training_examples.load(folder, keys).count_in(trained) == len(trained)


def test_the_key_is_never_written_inside_the_folder(days, tmp_path, monkeypatch, capsys):
  trained, _ = days
  with pytest.raises(ValueError, match="inside the output folder"):
    training_examples.save(trained, tmp_path, tmp_path / "keys")
  assert not (tmp_path / "keys").exists() and not (tmp_path / training_examples.FILE).exists()
  monkeypatch.setenv(training_examples.SECRETS_ENV, str(tmp_path / "out" / "keys"))
  assert training_examples.secrets_dir() == tmp_path / "out" / "keys"
  assert training_examples.secrets_dir(str(tmp_path / "k")) == tmp_path / "k"
  # sparse-dp train refuses before reading any data.
  assert main(["train", "--max-examples", "100", "--out", str(tmp_path / "out")]) == 2
  assert "is inside --out" in capsys.readouterr().err
  assert not (tmp_path / "out").exists()
