"""``distill --teacher`` refuses public data holding the teacher's training examples, by content.

``sparse-dp train`` records a keyed hash of its training examples' features, its key
outside the folder (:mod:`sparse_dp.data.training_examples`); the refusal must hold for a copy, a
hard or symbolic link, the same examples in another file, a file sharing some
examples, and a label-flipped copy, and pass data that shares none.
"""

import gzip
import os
import shutil

import pytest

from sparse_dp.cli import build_parser
from sparse_dp.data import training_examples
from sparse_dp.data.synthetic import SyntheticCriteo
from sparse_dp.jobs.distill import pctr_inputs
from sparse_dp.models.pctr_data import CriteoSplit

EXAMPLES = 300  # --max-examples and --max-public-examples
TRAINED = 270  # the first 90% of --data


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  """A teacher folder's record of its training data (the first 90% of day 1) and the days."""
  root = tmp_path_factory.mktemp("data")
  synthetic = SyntheticCriteo(scale=0.01, seed=0)
  private = synthetic.write_day(root / "day_1.gz", 1, EXAMPLES)
  public = synthetic.write_day(root / "day_2.gz", 2, EXAMPLES)
  folder, keys = root / "teacher", root / "keys"
  folder.mkdir()
  training_examples.save(CriteoSplit.read([private], EXAMPLES, "error").train, folder, keys)
  return root, private, public, folder, keys


def _load(teacher, public_data, features_are_public=False):
  root, private, _, folder, keys = teacher
  args = build_parser().parse_args([
      "distill", "--method", "dp-teacher", "--synthetic-scale", "0.01", "--max-examples",
      str(EXAMPLES), "--max-public-examples", str(EXAMPLES), "--data", str(private),
      "--public-data", str(public_data), "--teacher", str(folder), "--out", "r.json"])
  return pctr_inputs.load(args, root, features_are_public=features_are_public,
                          recorded=training_examples.load(folder, keys))


def _lines(path):
  with gzip.open(path, "rt") as handle:
    return handle.read().splitlines()


@pytest.mark.parametrize("make", ["same path", "copy", "hard link", "symbolic link",
                                  "decompressed", "labels flipped"])
def test_the_training_data_under_any_name_is_refused(teacher, tmp_path, make):
  _, private, _, _, _ = teacher
  public = tmp_path / "public.gz"
  if make == "same path":
    public = private
  elif make == "copy":
    shutil.copy(private, public)
  elif make == "hard link":
    os.link(private, public)
  elif make == "symbolic link":
    public.symlink_to(private)
  elif make == "decompressed":
    public = tmp_path / "public.txt"
    public.write_text("\n".join(_lines(private)) + "\n")
  else:
    with gzip.open(public, "wt") as out:
      out.writelines(f"{1 - int(line[0])}{line[1:]}\n" for line in _lines(private))
  with pytest.raises(ValueError, match=f"{TRAINED} of its {EXAMPLES} examples have the "
                                       "features of the teacher's private training"):
    _load(teacher, public)
  data = _load(teacher, public, features_are_public=True)
  assert data.private_examples_in_public == TRAINED and data.saw_private_features


def test_a_file_sharing_some_training_examples_is_refused_naming_how_many(teacher, tmp_path):
  _, private, public, _, _ = teacher
  mixed = tmp_path / "mixed.gz"
  with gzip.open(mixed, "wt") as out:  # 40 training, 10 held-out and 250 other examples
    out.write("\n".join(_lines(private)[230:280] + _lines(public)[:250]) + "\n")
  with pytest.raises(ValueError, match=f"40 of its {EXAMPLES} examples"):
    _load(teacher, mixed)


def test_disjoint_public_data_is_accepted(teacher):
  _, _, public, _, _ = teacher
  data = _load(teacher, public)
  assert data.private_examples_in_public == 0 and not data.saw_private_features
  assert len(data.public[1]) == EXAMPLES
