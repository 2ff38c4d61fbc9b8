"""Reading Criteo files as a ``tf.data`` stream, for files that do not fit in memory.

Lines are parsed in the graph, one at a time, with the same rules as
:class:`sparse_dp.data.criteo.CriteoReader`: a malformed line stops the stream with an error
naming the file and line (``MalformedLineError``, or, inside ``model.fit``, a
``tf.errors.InvalidArgumentError`` whose message carries the same text after
:data:`MALFORMED_LINE`); with ``on_bad_line="skip"`` the line is dropped and counted in
``CriteoStream.skipped_lines``.

Each element is ``({"integers": float32[13], "categorical": int64[26]},
label float32[1])``: integer features as ``log(1 + max(x, 0))`` with missing
as 0 (App. D.1.1), categorical features encoded by a
:class:`sparse_dp.data.vocabulary.Vocabulary` exactly as its pandas ``encode``
does. See docs/commands/train.md ("The data").
"""

from __future__ import annotations

import contextlib
import pathlib
from typing import Iterator, Sequence

import tensorflow as tf

from sparse_dp.data.criteo import MalformedLineError
from sparse_dp.data.criteo_format import INTEGER_FAULT, INTEGER_PATTERN, NUM_FIELDS, NUM_INTEGER
from sparse_dp.data.vocabulary import FIRST_BUCKET_ID, MISSING_ID, OOV_ID, Vocabulary

MALFORMED_LINE = "malformed Criteo line: "


class CriteoStream:
  """Criteo text files (plain or ``.gz``) as a ``tf.data.Dataset`` of encoded examples."""

  def __init__(self, paths: Sequence, vocabulary: Vocabulary, on_bad_line: str = "error"):
    if on_bad_line not in ("error", "skip"):
      raise ValueError(f"on_bad_line must be 'error' or 'skip', got {on_bad_line!r}")
    self.paths = [pathlib.Path(p) for p in paths]
    missing = [str(p) for p in self.paths if not p.is_file()]
    if missing or not self.paths:
      raise FileNotFoundError(f"no such Criteo file: {', '.join(missing) or '(none given)'}")
    self.vocabulary = vocabulary
    self.on_bad_line = on_bad_line
    self.skipped_lines = tf.Variable(0, dtype=tf.int64, trainable=False, name="skipped_lines")
    self._tables = [None if f.hash_buckets else tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(
            tf.constant(f.buckets or [""], tf.string),
            tf.constant(list(range(FIRST_BUCKET_ID, FIRST_BUCKET_ID + len(f.buckets)))
                        or [OOV_ID], tf.int64)), OOV_ID) for f in vocabulary.features]

  def dataset(self) -> tf.data.Dataset:
    """Every valid line of every file, in order (shuffle and batch it yourself)."""
    lines = None
    for path in self.paths:
      compression = "GZIP" if path.suffix == ".gz" else ""
      numbered = tf.data.TextLineDataset(str(path), compression_type=compression).enumerate(1)
      numbered = numbered.map(lambda n, line, p=str(path): (p, n, line))
      lines = numbered if lines is None else lines.concatenate(numbered)
    checked = lines.map(_check_line)
    if self.on_bad_line == "error":
      checked = checked.map(_raise_if_malformed)
    else:
      checked = checked.filter(self._count_and_keep)
    return checked.map(lambda fields, *_: self.encode(fields))

  def __iter__(self) -> Iterator:
    """The examples eagerly; a malformed line raises ``MalformedLineError``."""
    with reporting_malformed_lines():
      yield from self.dataset()

  def _count_and_keep(self, fields, valid, where):
    del fields, where
    self.skipped_lines.assign_add(tf.cast(tf.logical_not(valid), tf.int64))
    return valid

  def encode(self, fields: tf.Tensor):
    """``(features, label)`` of a line's 40 fields (or of ``[40, n]``: n lines, column-wise)."""
    integers = fields[1:1 + NUM_INTEGER]
    integers = tf.strings.to_number(tf.where(integers == "", "0", integers), tf.float64)
    integers = tf.cast(tf.math.log1p(tf.maximum(integers, 0.0)), tf.float32)
    categorical = []
    for column, (feature, table) in enumerate(zip(self.vocabulary.features, self._tables)):
      value = fields[1 + NUM_INTEGER + column]
      if table is None:
        ids = FIRST_BUCKET_ID + tf.strings.to_hash_bucket_fast(value, feature.hash_buckets)
      else:
        ids = table.lookup(value)
      categorical.append(tf.where(value == "", tf.constant(MISSING_ID, tf.int64), ids))
    label = tf.strings.to_number(fields[:1], tf.float32)
    return {"integers": integers, "categorical": tf.stack(categorical)}, label


@contextlib.contextmanager
def reporting_malformed_lines():
  """Turns a stream's malformed-line ``InvalidArgumentError`` into ``MalformedLineError``."""
  try:
    yield
  except tf.errors.InvalidArgumentError as error:
    malformed = malformed_line_error(error)
    if malformed is None:
      raise
    raise malformed from None


def malformed_line_error(error: Exception) -> MalformedLineError | None:
  """The ``MalformedLineError`` a stream's ``InvalidArgumentError`` carries, if any."""
  message = str(getattr(error, "message", error))
  if MALFORMED_LINE not in message:
    return None
  text = message.split(MALFORMED_LINE, 1)[1].split("\n", 1)[0].rstrip("]").strip()
  text = text.replace("\\'", "'")
  return MalformedLineError(f"{text} (use on_bad_line='skip' / --on-bad-line skip to skip "
                            "and count malformed lines)")


def _check_line(path, number, line):
  """``(fields padded to 40, valid, "path:line: reason")`` of one line."""
  line = tf.strings.regex_replace(line, "\r$", "")
  fields = tf.strings.split(line, "\t")
  count = tf.size(fields)
  padded = tf.concat([fields, tf.fill([tf.maximum(NUM_FIELDS - count, 0)], "")], 0)[:NUM_FIELDS]
  integers = padded[1:1 + NUM_INTEGER]
  integer_ok = tf.logical_or(integers == "", tf.strings.regex_full_match(integers, INTEGER_PATTERN))
  label_ok = tf.logical_or(padded[0] == "0", padded[0] == "1")
  first_bad = tf.argmin(tf.cast(integer_ok, tf.int32))
  reason = tf.case([
      (count != NUM_FIELDS, lambda: tf.constant(f"expected {NUM_FIELDS} tab-separated fields")),
      (tf.logical_not(label_ok),
       lambda: tf.strings.join(["label '", padded[0], "' is not 0 or 1"])),
      (tf.logical_not(tf.reduce_all(integer_ok)),
       lambda: tf.strings.join(["int_", tf.strings.as_string(first_bad + 1), " = '",
                                tf.gather(integers, first_bad), "' " + INTEGER_FAULT])),
  ], default=lambda: tf.constant(""), exclusive=False)
  where = tf.strings.join([path, ":", tf.strings.as_string(number), ": ", reason])
  return padded, reason == "", where


def _raise_if_malformed(fields, valid, where):
  check = tf.debugging.Assert(valid, [tf.strings.join([MALFORMED_LINE, where])])
  with tf.control_dependencies([check]):
    return tf.identity(fields), valid, where
