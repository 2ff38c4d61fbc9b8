"""Numbered Criteo files, Beam samples of them and their batches, shared by the sampling tests."""

import json
import pathlib

from sparse_dp.jobs.sample import pipeline
from sparse_dp.jobs.sample.draws import SecretSeed

from support.criteo_lines import HAND_WRITTEN, write

SEED_BYTES = b"test seed: not a secret, 32 byte"
SEED = SecretSeed(SEED_BYTES)
SALT = "5a17" * 8


def numbered_lines(first: int, count: int) -> list[str]:
  """Valid Criteo lines made unique by their int_1 (the example's global number)."""
  head, rest = HAND_WRITTEN[0].split("\t", 2)[0], HAND_WRITTEN[0].split("\t", 2)[2]
  return [f"{head}\t{first + i}\t{rest}" for i in range(count)]


def write_days(folder: pathlib.Path, counts) -> list[str]:
  """Writes ``folder/day_<i>`` of ``counts[i]`` numbered lines, numbered on across the days."""
  folder.mkdir()
  first, paths = 0, []
  for day, count in enumerate(counts):
    paths.append(str(write(folder / f"day_{day}", numbered_lines(first, count))))
    first += count
  return paths


def draw_sample(paths, out, seed=SEED, salt=SALT, **spec) -> dict:
  """Runs the sampling pipeline on ``paths`` into ``out``; returns the manifest it wrote."""
  spec = pipeline.SampleSpec(paths=tuple(paths), out=str(out), salt=salt, **spec)
  pipeline.run(spec, seed)
  return json.loads((pathlib.Path(out) / "manifest.json").read_text())


def read_batches(out) -> list[list[str]]:
  """The lines of each step's batch, in step order, read from the shards."""
  import tensorflow as tf
  manifest = json.loads((pathlib.Path(out) / "manifest.json").read_text())
  batches = []
  for shard in manifest["shards"]:
    for record in tf.data.TFRecordDataset(str(pathlib.Path(out) / shard["file"])):
      example = tf.train.Example.FromString(record.numpy())
      assert example.features.feature["step"].int64_list.value[0] == len(batches)
      batches.append([v.decode() for v in example.features.feature["lines"].bytes_list.value])
  assert [len(b) for b in batches] == [s for sh in manifest["shards"] for s in sh["batch_sizes"]]
  return batches


def shared_examples(first: list[list[str]], second: list[list[str]]) -> int:
  """Examples in both samples' batch of the same step, over all steps."""
  return sum(len(set(a) & set(b)) for a, b in zip(first, second))


def copy_sample(sample: pathlib.Path, to: pathlib.Path) -> pathlib.Path:
  """Copies a sample's files (not its claims folder) into a new folder ``to``."""
  to.mkdir()
  for path in sample.glob("*.*"):
    (to / path.name).write_bytes(path.read_bytes())
  return to


def write_small_sample(folder: pathlib.Path) -> pathlib.Path:
  """``folder``: data/ (two days, 1,000 lines), sample/ (5 steps of q = 0.02) and its seed."""
  paths = write_days(folder / "data", [600, 400])
  draw_sample(paths, folder / "sample", batch_size=20, steps=5, batches_per_shard=2)
  (folder / "seed").write_bytes(SEED_BYTES)
  return folder
