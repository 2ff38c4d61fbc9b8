"""The main job's data: Criteo examples, a held-out split, a vocabulary, model inputs.

The vocabulary of a DP run must not be a function of the private training
data (a bucket seen once would reveal its example), so private algorithms get
:meth:`Vocabulary.hashed` into the public Table-3 sizes (times the synthetic
data's scale), or a vocabulary file the user declares public. Counting the
training data (``counted``) is offered only to ``none``.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Optional, Sequence

import numpy as np
import pandas as pd

from sparse_dp.data.criteo import CriteoReader, integer_features
from sparse_dp.data.criteo_format import TABLE3_VOCABULARY_SIZES
from sparse_dp.data.criteo_stream import CriteoStream, reporting_malformed_lines
from sparse_dp.data.vocabulary import Vocabulary

EVAL_SHARE = 0.1


@dataclasses.dataclass(frozen=True)
class CriteoSplit:
  """The first ``1 - EVAL_SHARE`` of the examples for training, the rest held out."""

  train: pd.DataFrame
  held_out: pd.DataFrame
  skipped_lines: int

  @classmethod
  def read(cls, paths: Sequence[pathlib.Path], max_examples: int,
           on_bad_line: str) -> "CriteoSplit":
    reader = CriteoReader(paths, on_bad_line=on_bad_line)
    frame = reader.read_all(max_examples)
    reader.refuse_no_examples(len(frame))
    split = held_out_start(len(frame))
    return cls(frame.iloc[:split], frame.iloc[split:], reader.skipped_lines)


@dataclasses.dataclass(frozen=True)
class EncodedSplit:
  """:class:`CriteoSplit`'s split as the model's ``(features, labels)``, each chunk of
  lines encoded as it is read, so the examples' text (pandas strings) is never held
  whole: 1,000,000 lines peak at about half the memory of :class:`CriteoSplit` and
  :func:`model_inputs` (``benchmarks/results/study_read_memory.json``). The arrays, 26
  int64 ids, 13 float32 integer features and a label (264 bytes an example), are held
  twice while the chunks are joined. For a vocabulary not counted on the data (hashed,
  or a file)."""

  train: tuple
  held_out: tuple
  skipped_lines: int

  @classmethod
  def read(cls, paths: Sequence[pathlib.Path], max_examples: Optional[int], on_bad_line: str,
           vocabulary: Vocabulary, categorical: Optional[Sequence[int]] = None,
           chunk_size: int = 100_000) -> "EncodedSplit":
    """The first ``max_examples`` (None: all) examples of ``paths``, encoded with
    ``vocabulary`` and split as :meth:`CriteoSplit.read` splits them (the same arrays
    and skipped lines at the same ``chunk_size``); ``categorical``: the categorical
    features kept (None: all 26), in that order."""
    reader = CriteoReader(paths, chunk_size, on_bad_line)
    chunks = []
    for frame in reader.capped(max_examples):
      x, y = model_inputs(frame, vocabulary)
      if categorical is not None:
        x["categorical"] = np.ascontiguousarray(x["categorical"][:, list(categorical)])
      chunks.append((x, y))
    total = sum(len(y) for _, y in chunks)
    reader.refuse_no_examples(total)
    split = held_out_start(total)
    examples = ({name: np.concatenate([x[name] for x, _ in chunks]) for name in chunks[0][0]},
                np.concatenate([y for _, y in chunks]))
    return cls(example_rows(examples, 0, split), example_rows(examples, split, total),
               reader.skipped_lines)


def example_rows(examples: tuple, start: int, stop: int) -> tuple:
  """Examples ``start`` to ``stop`` of ``(features, labels)`` (views, not copies)."""
  features, labels = examples
  return {name: values[start:stop] for name, values in features.items()}, labels[start:stop]


def held_out_start(examples: int) -> int:
  """The index of the first held-out example of ``examples`` read: the last
  ``EVAL_SHARE`` of them are held out."""
  split = int(examples * (1 - EVAL_SHARE))
  if split < 1 or split == examples:
    raise ValueError(f"{examples} examples read: too few to hold out {EVAL_SHARE:.0%} "
                     "for evaluation (raise --max-examples or give more data)")
  return split


@dataclasses.dataclass(frozen=True)
class StreamedExamples:
  """Training examples read by ``tf.data`` (:class:`CriteoStream`): counted, never held.

  Batches are shuffled (``shuffle_buffer``) fixed-size batches, not Poisson
  samples: the report says so (``poisson_sampling: false``).
  """

  stream: CriteoStream
  num_examples: int
  skipped_lines: int  # in one pass over the files
  max_examples: Optional[int] = None
  shuffle_buffer: int = 100_000

  @classmethod
  def open(cls, paths, vocabulary: Vocabulary, on_bad_line: str,
           max_examples: Optional[int]) -> "StreamedExamples":
    stream = CriteoStream(paths, vocabulary, on_bad_line)
    examples = stream.dataset().take(-1 if max_examples is None else max_examples)
    with reporting_malformed_lines():
      count = int(examples.reduce(np.int64(0), lambda count, _: count + 1))
    if count < 1:
      raise ValueError(f"no example in {', '.join(map(str, paths))}")
    return cls(stream, count, int(stream.skipped_lines.numpy()), max_examples)

  def dataset(self):
    return self.stream.dataset().take(-1 if self.max_examples is None else self.max_examples)


def held_out_inputs(paths, vocabulary: Vocabulary, on_bad_line: str, max_examples: int):
  """``(features, labels)`` of up to ``max_examples`` held-out examples, via ``tf.data``."""
  with reporting_malformed_lines():
    batches = list(CriteoStream(paths, vocabulary, on_bad_line).dataset().take(max_examples)
                   .batch(65_536).as_numpy_iterator())
  if not batches:
    raise ValueError(f"no example in the held-out files {', '.join(map(str, paths))}")
  return ({name: np.concatenate([x[name] for x, _ in batches]) for name in batches[0][0]},
          np.concatenate([y for _, y in batches]))


def hashed_vocabulary(table_scale: float) -> Vocabulary:
  """Each feature hashed into its Table-3 vocabulary size times ``table_scale`` (public)."""
  return Vocabulary.hashed([max(2, int(round(v * table_scale))) for v in TABLE3_VOCABULARY_SIZES])


def job_vocabulary(choice: str, split: CriteoSplit, private: bool, table_scale: float,
                   min_count: int, features: Optional[int] = None) -> Vocabulary:
  """``choice``: ``hashed``, ``counted`` (non-private only) or a vocabulary JSON path;
  of the first ``features`` categorical features (all where None)."""
  return _job_vocabulary(choice, split, private, table_scale, min_count).leading(features)


def _job_vocabulary(choice: str, split: CriteoSplit, private: bool, table_scale: float,
                    min_count: int) -> Vocabulary:
  if choice == "hashed":
    return hashed_vocabulary(table_scale)
  if choice == "counted":
    if private:
      raise ValueError("--vocabulary counted counts the private training data, which a DP "
                       "run must not publish; use --vocabulary hashed, or a vocabulary "
                       "file built on public data")
    return Vocabulary.build([split.train], min_count=min_count)
  path = pathlib.Path(choice)
  if not path.is_file():
    raise ValueError(f"--vocabulary {choice!r} is neither 'hashed', 'counted' nor a file")
  return Vocabulary.load(path)


def model_inputs(frame: pd.DataFrame, vocabulary: Vocabulary):
  """``(features, labels)`` of ``frame`` for the pCTR model."""
  features = {"integers": integer_features(frame), "categorical": vocabulary.encode(frame)}
  return features, frame["label"].to_numpy(np.float32)[:, None]
