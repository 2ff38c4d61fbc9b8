"""Criteo-format reading with line-accurate errors, and the synthetic generator."""

import gzip

import numpy as np
import pandas as pd
import pytest

from sparse_dp.data.criteo import CriteoReader, MalformedLineError, integer_features
from sparse_dp.data.criteo_format import INTEGER_NAMES, TABLE3_VOCABULARY_SIZES
from sparse_dp.data.synthetic import SyntheticCriteo, planted_auc
from sparse_dp.models.pctr_data import CriteoSplit, EncodedSplit, hashed_vocabulary, model_inputs

from support.criteo_lines import BAD_LINES, HAND_WRITTEN, write


@pytest.mark.parametrize("compress", [False, True])
def test_reads_real_criteo_lines(tmp_path, compress):
  path = write(tmp_path / ("day_0.gz" if compress else "train.txt"), HAND_WRITTEN, compress)
  frame = CriteoReader([path]).read_all()
  assert list(frame["label"]) == [0, 1]
  assert frame["int_1"].iloc[0] == 1 and np.isnan(frame["int_1"].iloc[1])
  assert frame["int_2"].iloc[1] == -1
  assert frame["categorical-feature-14"].iloc[0] == "68fd1e64"
  assert frame["categorical-feature-14"].iloc[1] is None
  features = integer_features(frame)
  assert features.shape == (2, 13) and features[1, 1] == 0.0  # log(1 + max(-1, 0))
  assert features[0, 4] == pytest.approx(np.log1p(1382))


@pytest.mark.parametrize("bad_line,reason", BAD_LINES)
def test_malformed_line_names_file_and_line_or_is_skipped_and_counted(tmp_path, bad_line, reason):
  lines = HAND_WRITTEN * 3
  lines.insert(4, bad_line)  # line 5
  path = write(tmp_path / "train.txt", lines)
  with pytest.raises(MalformedLineError) as error:
    CriteoReader([path], chunk_size=2).read_all()
  assert f"train.txt:5: {reason}" in str(error.value)
  reader = CriteoReader([path], chunk_size=2, on_bad_line="skip")
  assert len(reader.read_all()) == 6 and reader.skipped_lines == 1


# Fields that a reader could take for something else: quotes, NA strings, comment and
# separator characters, spaces, leading zeros, negative zero, long integers, non-ASCII text.
_INTEGER_FIELDS = ["", "0", "-0", "007", "-12", "123456789012", "5", "999999999999999",
                   "-000000000000005"]
_CATEGORICAL_FIELDS = ["", '"quoted"', '"', "NA", "null", "nan", "N/A", "#x", " spaced ",
                       "a,b", "1e5", "00012", "\u00e9t\u00e9", "68fd1e64", "\\"]


def test_a_chunk_read_by_the_fast_path_equals_its_field_by_field_parse():
  rng = np.random.default_rng(0)
  lines = ["\t".join([str(rng.integers(2))] + list(rng.choice(_INTEGER_FIELDS, 13))
                     + list(rng.choice(_CATEGORICAL_FIELDS, 26))) for _ in range(300)]
  lines += HAND_WRITTEN
  fast = CriteoReader([], on_bad_line="skip").parse_lines(lines, "day", 1)
  # One malformed line sends the chunk through the field-by-field checks.
  checked_reader = CriteoReader([], on_bad_line="skip")
  checked = checked_reader.parse_lines(lines + [BAD_LINES[0][0]], "day", 1)
  assert checked_reader.skipped_lines == 1
  pd.testing.assert_frame_equal(fast, checked, check_exact=True)
  assert fast["categorical-feature-14"].map(type).isin([str, type(None)]).all()
  integers = fast[list(INTEGER_NAMES)].to_numpy()
  assert (integers == 0).any() and not np.signbit(integers[integers == 0]).any()


@pytest.mark.parametrize("field", ["000000000000000007", "96948958453992276", "-1" + "0" * 15])
def test_an_integer_of_16_to_18_digits_is_read_exactly(field):
  # pandas' C reader rounds such a field (the first to 0.0, the second off by 2); a chunk
  # that has one takes the field-by-field parse.
  line = HAND_WRITTEN[0].replace("\t1382\t", f"\t{field}\t", 1)
  frame = CriteoReader([]).parse_lines([line, HAND_WRITTEN[1]], "day", 1)
  assert frame["int_5"].iloc[0] == float(int(field))


def test_a_non_ascii_digit_is_a_malformed_line():
  line = HAND_WRITTEN[0].replace("\t1382\t", "\t\u0661\u0663\t", 1)  # Arabic-Indic 13
  with pytest.raises(MalformedLineError, match="day:2: int_5 = '\u0661\u0663' is not an int"):
    CriteoReader([]).parse_lines(HAND_WRITTEN[:1] + [line], "day", 1)


def test_missing_file_is_named(tmp_path):
  with pytest.raises(FileNotFoundError, match="day_7"):
    CriteoReader([tmp_path / "day_7"])


def test_synthetic_days_round_trip_through_the_reader(tmp_path):
  synthetic = SyntheticCriteo(scale=0.1, seed=3)
  assert synthetic.vocabulary_sizes[2] == round(TABLE3_VOCABULARY_SIZES[2] * 0.1)
  path = synthetic.write_day(tmp_path / "day_1.gz", day=1, count=3000)
  frame = CriteoReader([path], chunk_size=1000).read_all()
  expected = synthetic.examples(day=1, count=3000)
  np.testing.assert_array_equal(frame["label"].to_numpy(), expected["labels"])
  assert 0.15 < frame["label"].mean() < 0.45
  # Deterministic given the seed; buckets are distinct hex hashes per bucket.
  assert synthetic.write_day(tmp_path / "again.gz", 1, 3000).read_bytes() != b""
  again = CriteoReader([tmp_path / "again.gz"]).read_all()
  assert again.equals(frame)
  column = frame["categorical-feature-16"].dropna()
  assert column.str.fullmatch(r"[0-9a-f]{8}").all()
  assert column.nunique() == len(np.unique(
      expected["buckets"][:, 2][expected["buckets"][:, 2] >= 0]))


@pytest.mark.parametrize("max_examples", [None, 240, 250])
def test_an_encoded_split_is_the_split_frames_encoded(tmp_path, max_examples):
  # Read chunk by chunk (40 lines: the caps fall on a chunk's end and inside one), with a
  # malformed line skipped: the model's arrays of CriteoSplit's frames, bit for bit.
  lines = gzip.decompress(SyntheticCriteo(scale=0.01, seed=5).write_day(
      tmp_path / "day.gz", 1, 350).read_bytes()).decode().splitlines()
  lines.insert(100, BAD_LINES[0][0])
  path = write(tmp_path / "train.txt", lines)
  vocabulary = hashed_vocabulary(0.01)
  encoded = EncodedSplit.read([path], max_examples, "skip", vocabulary, [3, 0, 7],
                              chunk_size=40)
  frames = CriteoSplit.read([path], max_examples, "skip")
  assert encoded.skipped_lines == frames.skipped_lines == 1
  for arrays, frame in [(encoded.train, frames.train), (encoded.held_out, frames.held_out)]:
    x, y = model_inputs(frame, vocabulary)
    np.testing.assert_array_equal(arrays[0]["categorical"], x["categorical"][:, [3, 0, 7]])
    np.testing.assert_array_equal(arrays[0]["integers"], x["integers"])
    np.testing.assert_array_equal(arrays[1], y)
  assert len(encoded.train[1]) + len(encoded.held_out[1]) == (max_examples or 350)
  with pytest.raises(MalformedLineError, match="train.txt:101"):
    EncodedSplit.read([path], None, "error", vocabulary, chunk_size=40)
  with pytest.raises(ValueError, match="1 examples read: too few"):
    EncodedSplit.read([path], 1, "skip", vocabulary)


def test_planted_model_is_learnable_and_days_drift():
  synthetic = SyntheticCriteo(scale=0.1, seed=0)
  day0 = synthetic.examples(0, 20_000)  # Criteo-1TB's numbering: day_0 .. day_23
  assert 0.7 < planted_auc(day0["labels"], day0["probabilities"]) < 0.9
  def top(d):
    return set(np.argsort(-np.bincount(d["buckets"][:, 2][d["buckets"][:, 2] >= 0]))[:50])

  day23 = synthetic.examples(23, 20_000)
  assert len(top(day0) & top(day23)) < 40  # popular buckets move over the days
  assert len(top(day0) & top(synthetic.examples(0, 20_000))) >= 45


def test_vocabulary_ids_thresholds_hashing_and_round_trip(tmp_path):
  import pandas as pd

  from sparse_dp.data.criteo_format import CATEGORICAL_NAMES
  from sparse_dp.data.vocabulary import MISSING_ID, OOV_ID, Vocabulary

  frame = pd.DataFrame({name: ["a", "a", "b", None, "c", "a"] for name in CATEGORICAL_NAMES})
  vocabulary = Vocabulary.build([frame], min_count=1, max_size=2)
  first = vocabulary.features[0]
  assert first.buckets == ["a", "b"] and first.counts == [3, 1] and first.size == 4
  ids = vocabulary.encode(pd.DataFrame({n: ["b", "zzz", None] for n in CATEGORICAL_NAMES}))
  assert ids[:, 0].tolist() == [3, OOV_ID, MISSING_ID]
  assert Vocabulary.build([frame], min_count=2).features[0].buckets == ["a"]
  hashed = Vocabulary.build([frame], hash_buckets=10)
  assert hashed.sizes[0] == 12 and 2 <= hashed.encode(frame)[0, 0] < 12
  reloaded = Vocabulary.load(vocabulary.save(tmp_path / "vocabulary.json"))
  assert reloaded.encode(frame).tolist() == vocabulary.encode(frame).tolist()
