"""The Beam pipeline of ``sparse-dp sample``: a Poisson sample of Criteo files, by step.

    files -> [count N] -> Map: each example's steps (keyed, secret-seeded draws)
          -> GroupByKey(step) -> truncate to M -> GroupByKey(shard) -> TFRecord shards
          -> manifest.json

Each example joins each of the ``T`` steps' batches independently with probability
``q = B / N`` (:mod:`sparse_dp.jobs.sample.draws`): batch ``t`` is an exact Poisson sample
(Ghazi et al., NeurIPS 2023, §3.3) of every valid example of the files, and the shuffle moves
only the ``T B`` sampled copies. A shard is a TFRecord file of ``batches_per_shard``
consecutive steps, one ``tf.train.Example`` per batch (``step``, ``lines``). ``N`` is counted
by a first pass unless given, and checked against the draw pass's count; the signed manifest
is written last. See docs/commands/sample.md ("How the sample is drawn").
"""


from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import posixpath
from typing import Iterator, Optional

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from sparse_dp.data.criteo import CriteoReader
from sparse_dp.data.criteo_format import CATEGORICAL_NAMES, INTEGER_NAMES
from sparse_dp.jobs.sample.draws import SampleKey, SecretSeed, example_key, truncate
from sparse_dp.jobs.sample.manifest import MANIFEST_NAME, Manifest, Shard, file_digest

_CHUNK_LINES = 20_000


@dataclasses.dataclass(frozen=True)
class SampleSpec:
  """What to sample: ``steps`` batches of expected size ``batch_size`` from ``paths``."""

  paths: tuple[str, ...]
  out: str
  batch_size: int
  steps: int
  salt: str  # public, hex: keys the draws with the secret seed
  num_examples: Optional[int] = None  # None: counted by the pipeline
  max_batch_size: Optional[int] = None
  batches_per_shard: int = 64
  on_bad_line: str = "error"
  reproduces: Optional[Manifest] = None  # the manifest a reproduction must give again

  @property
  def num_shards(self) -> int:
    return -(-self.steps // self.batches_per_shard)

  def shard_file(self, shard: int) -> str:
    return f"batches-{shard:05d}-of-{self.num_shards:05d}.tfrecord"


def run(spec: SampleSpec, seed: "SecretSeed | str", options=None) -> None:
  """Runs the pipeline (``options``: Beam ``PipelineOptions``; ``seed``: a seed or its file's
  path, which is all that travels to remote workers)."""
  if not FileSystems.exists(spec.out):
    FileSystems.mkdirs(spec.out)
  with beam.Pipeline(options=options) as pipeline:
    files = pipeline | "Files" >> beam.Create(list(spec.paths))
    if spec.num_examples is None:
      count = (files | "CountExamples" >> beam.ParDo(_CountExamples(spec.on_bad_line))
               | "SumCounts" >> beam.CombineGlobally(sum))
      num_examples = beam.pvalue.AsSingleton(count)
    else:
      num_examples = spec.num_examples
    drawn = files | "Draw" >> beam.ParDo(_DrawSteps(spec, seed), num_examples).with_outputs(
        _FILE_STATS, main="examples")
    batches = (drawn.examples | "GroupByStep" >> beam.GroupByKey()
               | "Truncate" >> beam.ParDo(_Truncate(spec, seed)))
    every_shard = pipeline | "EveryShard" >> beam.Create(
        [(shard, None) for shard in range(spec.num_shards)])
    shards = ((batches, every_shard) | "AllShards" >> beam.Flatten()
              | "GroupByShard" >> beam.GroupByKey()
              | "WriteShards" >> beam.Map(_write_shard, spec)
              | "ShardList" >> beam.combiners.ToList())
    inputs = drawn[_FILE_STATS] | "FileList" >> beam.combiners.ToList()
    _ = shards | "WriteManifest" >> beam.Map(
        _write_manifest, spec, beam.pvalue.AsSingleton(inputs), num_examples, seed)


_FILE_STATS = "file_stats"


def _examples(path: str, on_bad_line: str, stats: dict) -> Iterator:
  """Chunks (DataFrames) of the valid examples of ``path``; fills ``stats`` at the end."""
  digest, size = hashlib.sha256(), 0
  reader = CriteoReader([], chunk_size=_CHUNK_LINES, on_bad_line=on_bad_line)
  with FileSystems.open(path, compression_type="uncompressed") as raw:
    hashed = _HashingReader(raw, digest)
    binary = gzip.GzipFile(fileobj=hashed) if path.endswith(".gz") else hashed
    text = io.TextIOWrapper(binary, encoding="utf-8", newline="")
    first_line = 1
    while lines := [line.rstrip("\n").rstrip("\r") for _, line in zip(range(_CHUNK_LINES), text)]:
      frame = reader.parse_lines(lines, path, first_line)
      first_line += len(lines)
      yield frame
    size = hashed.bytes_read
  stats.update(bytes=size, sha256=digest.hexdigest(), skipped_lines=reader.skipped_lines)


class _HashingReader(io.RawIOBase):
  """A binary file that hashes the bytes read through it."""

  def __init__(self, raw, digest):
    super().__init__()
    self._raw, self._digest, self.bytes_read = raw, digest, 0

  def readable(self) -> bool:
    return True

  def readinto(self, buffer) -> int:
    data = self._raw.read(len(buffer))
    self._digest.update(data)
    self.bytes_read += len(data)
    buffer[:len(data)] = data
    return len(data)


class _CountExamples(beam.DoFn):
  """The valid examples of one file (the first pass, when ``N`` is not given)."""

  def __init__(self, on_bad_line: str):
    super().__init__()
    self._on_bad_line = on_bad_line

  def process(self, path: str):
    yield sum(len(frame) for frame in _examples(path, self._on_bad_line, {}))


class _DrawSteps(beam.DoFn):
  """``(step, (key, line))`` for every step each example of a file joins."""

  def __init__(self, spec: SampleSpec, seed: "SecretSeed | str"):
    super().__init__()
    self._spec, self._seed, self._key = spec, seed, None

  def setup(self):
    self._key = _sample_key(self._seed, self._spec)

  def process(self, path: str, num_examples: int):
    spec = self._spec
    if not spec.batch_size < num_examples:
      raise ValueError(f"--batch-size {spec.batch_size} is not below the {num_examples:,} "
                       "examples of --data (q = batch_size / N must be < 1): give a smaller "
                       "batch size or more data")
    rate = spec.batch_size / num_examples
    name = posixpath.basename(path)
    stats, ordinal = {"name": name, "path": path}, 0
    for frame in _examples(path, spec.on_bad_line, stats):
      for row in range(len(frame)):
        key = example_key(name, ordinal + row)
        joined = self._key.inclusion_steps(key, rate, spec.steps)
        if joined:
          line = criteo_line(frame.iloc[row])
          for step in joined:
            yield step, (key, line)
      ordinal += len(frame)
    yield beam.pvalue.TaggedOutput(_FILE_STATS, {**stats, "examples": ordinal})


class _Truncate(beam.DoFn):
  """A step's batch, truncated to ``max_batch_size``, keyed by its shard."""

  def __init__(self, spec: SampleSpec, seed: "SecretSeed | str"):
    super().__init__()
    self._spec, self._seed, self._key = spec, seed, None

  def setup(self):
    self._key = _sample_key(self._seed, self._spec)

  def process(self, element):
    step, examples = element
    kept = truncate(self._key, step, list(examples), self._spec.max_batch_size)
    yield step // self._spec.batches_per_shard, (step, [line for _, line in kept])


def _load(seed: "SecretSeed | str") -> SecretSeed:
  return seed if isinstance(seed, SecretSeed) else SecretSeed.read(seed)


def _sample_key(seed: "SecretSeed | str", spec: SampleSpec) -> SampleKey:
  return _load(seed).for_sample(spec.salt)


def criteo_line(row) -> str:
  """One parsed example (a row of :class:`CriteoReader`'s frames) as a Criteo text line."""
  fields = [str(int(row["label"]))]
  fields += ["" if value != value else str(int(value)) for value in row[list(INTEGER_NAMES)]]
  fields += ["" if value is None else value for value in row[list(CATEGORICAL_NAMES)]]
  return "\t".join(fields)


def _write_shard(element, spec: SampleSpec) -> dict:
  """Writes one shard (every step of its range, empty ones too); returns its manifest entry."""
  import tensorflow as tf
  shard, batches = element
  by_step = dict(batch for batch in batches if batch is not None)
  first = shard * spec.batches_per_shard
  steps = range(first, min(first + spec.batches_per_shard, spec.steps))
  path = posixpath.join(spec.out, spec.shard_file(shard))
  with tf.io.TFRecordWriter(path) as writer:
    for step in steps:
      lines = [line.encode() for line in by_step.get(step, [])]
      writer.write(tf.train.Example(features=tf.train.Features(feature={
          "step": tf.train.Feature(int64_list=tf.train.Int64List(value=[step])),
          "lines": tf.train.Feature(bytes_list=tf.train.BytesList(value=lines)),
      })).SerializeToString())
  size, sha256 = file_digest(path)
  return dataclasses.asdict(Shard(spec.shard_file(shard), first,
                                  tuple(len(by_step.get(s, [])) for s in steps), size, sha256))


def _write_manifest(shards: list[dict], spec: SampleSpec, inputs: list[dict], num_examples: int,
                    seed: "SecretSeed | str") -> None:
  """Writes the signed manifest once the draw pass's ``N`` is checked against the ``N`` the
  draws used (``num_examples``: given, or counted by the first pass); a reproduction must
  give its manifest again, and writes none."""
  counted = sum(f["examples"] for f in inputs)
  if spec.reproduces is None and counted != num_examples:
    if spec.num_examples is not None:
      raise ValueError(f"--num-examples {spec.num_examples:,} but the files hold {counted:,} "
                       "valid examples: q = batch_size / N was wrong; sample again without "
                       "--num-examples (it is counted) or with the right number")
    raise ValueError(f"the files held {num_examples:,} valid examples when counted but "
                     f"{counted:,} when drawn: they changed while being sampled, so q = "
                     "batch_size / N is wrong; sample again from files that do not change")
  manifest = Manifest(
      num_examples=counted, batch_size=spec.batch_size, sampling_rate=spec.batch_size / counted,
      steps=spec.steps, max_batch_size=spec.max_batch_size,
      inputs=tuple(sorted(inputs, key=lambda f: f["name"])),
      shards=tuple(Shard(**s) for s in sorted(shards, key=lambda s: s["first_step"])),
      salt=spec.salt, on_bad_line=spec.on_bad_line).signed(_load(seed))
  manifest.check_consistent(MANIFEST_NAME)
  if spec.reproduces is not None:
    if manifest != spec.reproduces:
      changed = [f["name"] for f in manifest.inputs if f not in spec.reproduces.inputs]
      raise ValueError(f"--reproduce {spec.out!r}: the batches drawn again differ from the "
                       f"manifest's (input files changed since: {', '.join(changed) or 'none'}); "
                       "the manifest is left as it was, so training refuses the shards written "
                       "now: restore the input files and reproduce again, or sample again with "
                       "`sparse-dp sample` (a fresh salt)")
    return
  with FileSystems.create(posixpath.join(spec.out, MANIFEST_NAME)) as handle:
    handle.write(manifest.to_json().encode())
