"""Reading Criteo files into pandas, chunk by chunk, with line-accurate errors.

A malformed line (wrong number of fields, an integer field neither empty nor
``-?[0-9]{1,18}``, a label other than 0/1) stops the read with an error naming the file
and the line number; with ``on_bad_line="skip"`` it is skipped and counted
(``CriteoReader.skipped_lines``). Nothing is coerced silently: empty fields
are missing values, and only they.
"""

from __future__ import annotations

import csv
import gzip
import io
import pathlib
import re
from typing import Iterator, Sequence

import numpy as np
import pandas as pd

from sparse_dp.data.criteo_format import (
  CATEGORICAL_NAMES,
  INTEGER_FAULT,
  INTEGER_NAMES,
  INTEGER_PATTERN,
  NUM_CATEGORICAL,
  NUM_FIELDS,
  NUM_INTEGER,
)

COLUMNS = ("label",) + INTEGER_NAMES + CATEGORICAL_NAMES

# A line for pandas' C reader: label 0 or 1; 13 empty or integer fields of at most 15 ASCII
# digits (exact in float64; its parser rounds some longer ones, and reads 18 digits with
# leading zeros as 0); 26 fields without a tab, carriage return, newline or NUL (which would
# split a line there) or a lone surrogate (which it cannot encode). Other lines take the
# field-by-field checks.
_WELL_FORMED = re.compile(
    rf"[01](?:\t(?:-?[0-9]{{1,15}})?){{{NUM_INTEGER}}}"
    rf"(?:\t[^\t\r\n\x00\ud800-\udfff]*){{{NUM_CATEGORICAL}}}")


class MalformedLineError(ValueError):
  """A line of a Criteo file does not have the Criteo format."""


class CriteoReader:
  """Reads Criteo text files (plain or ``.gz``) as DataFrames of ``chunk_size`` rows.

  Columns: ``label`` (int8), the 13 integer features (float64, NaN when missing)
  and the 26 categorical features (strings, ``None`` when missing).
  """

  def __init__(self, paths: Sequence, chunk_size: int = 100_000, on_bad_line: str = "error"):
    if on_bad_line not in ("error", "skip"):
      raise ValueError(f"on_bad_line must be 'error' or 'skip', got {on_bad_line!r}")
    self.paths = [pathlib.Path(p) for p in paths]
    missing = [str(p) for p in self.paths if not p.is_file()]
    if missing:
      raise FileNotFoundError(f"no such Criteo file: {', '.join(missing)}")
    if chunk_size < 1:
      raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    self.chunk_size = chunk_size
    self.on_bad_line = on_bad_line
    self.skipped_lines = 0
    self.lines_read = 0

  def __iter__(self) -> Iterator[pd.DataFrame]:
    for path in self.paths:
      yield from self._read(path)

  def capped(self, max_examples: int | None = None) -> Iterator[pd.DataFrame]:
    """The frames of the first ``max_examples`` examples (None: all). Whole chunks are
    parsed, so a malformed line after the cap in the cap's chunk is still reported."""
    total = 0
    for frame in self:
      if max_examples is not None and total + len(frame) >= max_examples:
        yield frame.iloc[:max_examples - total]
        return
      yield frame
      total += len(frame)

  def read_all(self, max_examples: int | None = None) -> pd.DataFrame:
    """Every example (up to ``max_examples``) in one DataFrame."""
    frames = list(self.capped(max_examples))
    if not frames:
      return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    return pd.concat(frames, ignore_index=True)

  def refuse_no_examples(self, examples: int) -> None:
    """Refuses a read of ``examples == 0`` valid examples, saying why: no lines, or every
    line malformed and skipped.

    Raises:
      ValueError: naming the files and the cause.
    """
    if examples:
      return
    files = ", ".join(str(p) for p in self.paths)
    if not self.lines_read:
      raise ValueError(f"{files}: no lines to read (an empty file): give Criteo files of "
                       f"{NUM_FIELDS} tab-separated fields a line")
    raise ValueError(f"{files}: every one of the {self.lines_read:,} lines read is malformed "
                     "and was skipped (--on-bad-line skip): run with --on-bad-line error to "
                     "see the first one's line number and fault")

  def _read(self, path: pathlib.Path) -> Iterator[pd.DataFrame]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", newline="") as handle:
      first_line = 1
      while True:
        lines = [line.rstrip("\n").rstrip("\r") for _, line in
                 zip(range(self.chunk_size), handle)]
        if not lines:
          return
        self.lines_read += len(lines)
        frame = self.parse_lines(lines, path, first_line)
        first_line += len(lines)
        if len(frame):
          yield frame

  def parse_lines(self, lines: list[str], path, first_line: int) -> pd.DataFrame:
    """The examples of ``lines`` (line ``first_line`` of ``path`` first, for messages).

    A chunk whose lines all match ``_WELL_FORMED`` (the usual Criteo line) is read by pandas'
    C reader; any other chunk is checked field by field (the same frame for the same good
    lines), and each malformed line gets its reason.
    """
    if lines and all(map(_WELL_FORMED.fullmatch, lines)):
      return _well_formed_frame(lines)
    raw = pd.Series(lines, dtype=object)
    bad = (raw.str.count("\t") != NUM_FIELDS - 1).to_numpy(copy=True)
    # object, not a fixed-width string array, which would cut a longer reason short
    reasons = np.where(bad, f"expected {NUM_FIELDS} tab-separated fields", "").astype(object)
    fields = raw[~bad].str.split("\t", expand=True)
    if len(fields):
      fields.columns = list(COLUMNS)
      label_ok = fields["label"].isin(["0", "1"]).to_numpy()
      ints = fields[list(INTEGER_NAMES)]
      int_ok = (ints.eq("") | ints.apply(lambda c: c.str.fullmatch(INTEGER_PATTERN))).to_numpy()
      good_index = np.flatnonzero(~bad)
      for row in np.flatnonzero(~label_ok):
        bad[good_index[row]] = True
        reasons[good_index[row]] = f"label {fields['label'].iloc[row]!r} is not 0 or 1"
      for row, col in zip(*np.nonzero(~int_ok)):
        if not bad[good_index[row]]:
          bad[good_index[row]] = True
          reasons[good_index[row]] = (f"{INTEGER_NAMES[col]} = {ints.iat[row, col]!r} "
                                      f"{INTEGER_FAULT}")
    if bad.any():
      if self.on_bad_line == "error":
        first = int(np.flatnonzero(bad)[0])
        raise MalformedLineError(
            f"{path}:{first_line + first}: {reasons[first]} (use on_bad_line='skip' / "
            "--on-bad-line skip to skip and count malformed lines)")
      self.skipped_lines += int(bad.sum())
      fields = raw[~bad].str.split("\t", expand=True)
      if len(fields):
        fields.columns = list(COLUMNS)
    if not len(fields):
      return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})
    out = pd.DataFrame({"label": fields["label"].astype(np.int8)})
    for name in INTEGER_NAMES:
      # Python's float of the digits, correctly rounded (to_numeric rounds some 17-digit ones
      # where the column has a missing value); -0 as 0.0.
      out[name] = fields[name].replace("", "nan").astype(float) + 0.0
    for name in CATEGORICAL_NAMES:
      out[name] = fields[name].replace("", None)
    return out.reset_index(drop=True)


def _well_formed_frame(lines: list[str]) -> pd.DataFrame:
  """The frame of lines that all match ``_WELL_FORMED``, read by pandas' C reader.

  It equals the field-by-field parse: empty integers NaN (``-0`` as ``0.0``), empty
  categorical fields ``None``, every other field's text kept as written (no quoting, no
  ``NA`` strings).
  """
  missing = {name: [""] for name in INTEGER_NAMES + CATEGORICAL_NAMES}
  frame = pd.read_csv(
      io.StringIO("\n".join(lines)), sep="\t", header=None, names=list(COLUMNS),
      quoting=csv.QUOTE_NONE, keep_default_na=False, na_values=missing, engine="c",
      dtype={"label": np.int8, **dict.fromkeys(INTEGER_NAMES, np.float64),
             **dict.fromkeys(CATEGORICAL_NAMES, object)})
  integers = list(INTEGER_NAMES)
  frame[integers] = frame[integers] + 0.0  # -0.0 + 0.0 is 0.0, as the field-by-field parse
  categorical = frame[list(CATEGORICAL_NAMES)]
  frame[list(CATEGORICAL_NAMES)] = categorical.where(categorical.notna(), None)
  return frame


def integer_features(frame: pd.DataFrame) -> np.ndarray:
  """``log(1 + max(x, 0))`` of the 13 integer features, missing as 0 (App. D.1.1)."""
  values = frame[list(INTEGER_NAMES)].to_numpy(dtype=float)
  return np.log1p(np.maximum(np.nan_to_num(values, nan=0.0), 0.0)).astype(np.float32)

