"""The tf.data Criteo reader: same parsing, encoding and errors as the pandas reader."""

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp.data.criteo import CriteoReader, MalformedLineError, integer_features
from sparse_dp.data.criteo_stream import CriteoStream, malformed_line_error
from sparse_dp.data.synthetic import SyntheticCriteo
from sparse_dp.data.vocabulary import Vocabulary

from support.criteo_lines import BAD_LINES, HAND_WRITTEN, write


def stream_arrays(stream):
  batches = list(stream.dataset().batch(512).as_numpy_iterator())
  return (np.concatenate([x["integers"] for x, _ in batches]),
          np.concatenate([x["categorical"] for x, _ in batches]),
          np.concatenate([y for _, y in batches])[:, 0])


@pytest.mark.parametrize("vocabulary_kind", ["hashed", "counted"])
def test_stream_equals_pandas_reader_on_synthetic_and_hand_written_files(tmp_path,
                                                                         vocabulary_kind):
  day = SyntheticCriteo(scale=0.01, seed=3).write_day(tmp_path / "day_1.gz", 1, 1500)
  hand = write(tmp_path / "train.txt", HAND_WRITTEN)
  frame = CriteoReader([day, hand]).read_all()
  vocabulary = (Vocabulary.hashed([97] * 26) if vocabulary_kind == "hashed"
                else Vocabulary.build([frame.iloc[:700]], min_count=2))
  integers, categorical, labels = stream_arrays(CriteoStream([day, hand], vocabulary))
  np.testing.assert_array_equal(categorical, vocabulary.encode(frame))
  np.testing.assert_allclose(integers, integer_features(frame), rtol=1e-6)
  np.testing.assert_array_equal(labels, frame["label"].to_numpy())
  # Missing values, buckets, and (counted vocabularies only) out-of-vocabulary values occur.
  expected = {0} if vocabulary_kind == "hashed" else {0, 1}
  assert expected <= set(np.unique(categorical)) and categorical.max() > 1


@pytest.mark.parametrize("bad_line,reason", BAD_LINES)
def test_stream_names_file_and_line_or_skips_and_counts(tmp_path, bad_line, reason):
  lines = HAND_WRITTEN * 3
  lines.insert(4, bad_line)  # line 5
  path = write(tmp_path / "day_7", lines)
  vocabulary = Vocabulary.hashed([10] * 26)
  with pytest.raises(MalformedLineError) as error:
    list(CriteoStream([path], vocabulary))
  assert f"day_7:5: {reason}" in str(error.value)
  # Inside a graph consumer (model.fit) the error is TF's, carrying the same text.
  with pytest.raises(tf.errors.InvalidArgumentError) as raw:
    for _ in CriteoStream([path], vocabulary).dataset():
      pass
  assert f"day_7:5: {reason}" in str(malformed_line_error(raw.value))
  stream = CriteoStream([path], vocabulary, on_bad_line="skip")
  assert len(stream_arrays(stream)[2]) == 6 and int(stream.skipped_lines.numpy()) == 1


def test_stream_rejects_missing_files_and_bad_options(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.gz"):
    CriteoStream([tmp_path / "nope.gz"], Vocabulary.hashed([10] * 26))
  with pytest.raises(ValueError, match="on_bad_line"):
    CriteoStream([write(tmp_path / "t", HAND_WRITTEN)], Vocabulary.hashed([10] * 26), "ignore")
