"""A teacher's record of its training examples: their features' hashes, and a missing record."""

import numpy as np
import pytest

from sparse_dp.data import training_examples
from sparse_dp.data.criteo import CriteoReader
from sparse_dp.data.criteo_format import CATEGORICAL_NAMES, INTEGER_NAMES
from sparse_dp.data.synthetic import SyntheticCriteo


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


def test_a_teacher_folder_without_a_record_is_refused(tmp_path):
  with pytest.raises(ValueError, match="no record of its training examples"):
    training_examples.load(tmp_path)
