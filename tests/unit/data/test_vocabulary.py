"""A vocabulary of the first K features: the model of fewer tables over the same files."""

import numpy as np
import pytest

from sparse_dp.cli import main
from sparse_dp.data.criteo import CriteoReader
from sparse_dp.data.synthetic import SyntheticCriteo
from sparse_dp.models import pctr_data


def test_the_leading_features_encode_the_first_columns_as_all_of_them_do(tmp_path):
  path = SyntheticCriteo(scale=0.01).write_day(tmp_path / "day_1.gz", 1, 50)
  frame = CriteoReader([path]).read_all(50)
  vocabulary = pctr_data.hashed_vocabulary(0.01)
  two = vocabulary.leading(2)
  assert two.sizes == vocabulary.sizes[:2] and vocabulary.leading(None) is vocabulary
  np.testing.assert_array_equal(two.encode(frame), vocabulary.encode(frame)[:, :2])
  for bad in (0, 27):
    with pytest.raises(ValueError, match=r"--categorical-features must be in 1\.\.26"):
      vocabulary.leading(bad)


@pytest.mark.parametrize("command", ["train", "stream"])
def test_a_bad_count_is_refused_before_any_data_is_written(tmp_path, capsys, command):
  out = ["--out", str(tmp_path / "o")] if command == "train" else ["--state", str(tmp_path / "o")]
  assert main([command, "--categorical-features", "0", *out]) == 2
  assert "--categorical-features must be in 1..26, got 0" in capsys.readouterr().err
  assert not (tmp_path / "o").exists()
