"""The manifest of a Poisson sample: what was sampled, how, and the files that hold it.

``manifest.json`` sits beside the batch shards and says everything a training
job needs to account the sample, and to check that the shards are the ones
written: ``num_examples`` (``N``), ``batch_size`` (the expected batch ``B``),
``sampling_rate`` (``q = B / N``), ``steps`` (``T``), ``max_batch_size``
(truncation, or ``null``), the input files, the shards and the sample's public ``salt``.
It never holds the secret seed; ``mac``, keyed by the seed
(:meth:`sparse_dp.jobs.sample.draws.SampleKey.mac`), authenticates the rest, so an edited
manifest is refused. Its batch sizes and ``N`` depend on the data: the manifest is as
private as the batches. See docs/commands/sample.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from typing import Optional

from sparse_dp.jobs.sample.draws import SecretSeed

MANIFEST_NAME = "manifest.json"
FORMAT = "sparse-dp Poisson batches"
VERSION = 2  # 2: salted draws and a MAC
_HASH_CHUNK = 1 << 22


@dataclasses.dataclass(frozen=True)
class Shard:
  """One TFRecord file: one record per batch, of steps ``first_step ..`` in order."""

  file: str
  first_step: int
  batch_sizes: tuple[int, ...]
  bytes: int
  sha256: str

  @property
  def steps(self) -> range:
    return range(self.first_step, self.first_step + len(self.batch_sizes))


@dataclasses.dataclass(frozen=True)
class Manifest:
  """A Poisson sample of ``num_examples`` examples into ``steps`` batches of rate ``q``."""

  num_examples: int
  batch_size: int
  sampling_rate: float
  steps: int
  max_batch_size: Optional[int]
  inputs: tuple[dict, ...]
  shards: tuple[Shard, ...]
  salt: str  # public: keys the draws with the secret seed
  on_bad_line: str = "error"
  mac: str = ""  # of everything above, keyed by the seed ("": not signed yet)

  def to_json(self) -> str:
    body = dataclasses.asdict(self)
    return json.dumps({"format": FORMAT, "version": VERSION, **body}, indent=1)

  def _signed_bytes(self) -> bytes:
    """What the MAC covers: every field but ``mac``, in canonical JSON."""
    body = dataclasses.asdict(self)
    del body["mac"]
    return json.dumps({"format": FORMAT, "version": VERSION, **body}, sort_keys=True).encode()

  def signed(self, seed: SecretSeed) -> "Manifest":
    """This manifest with its MAC, keyed by ``seed`` and the salt."""
    return dataclasses.replace(self, mac=seed.for_sample(self.salt).mac(self._signed_bytes()))

  @classmethod
  def from_json(cls, text: str, where: str, seed: SecretSeed) -> "Manifest":
    """The manifest in ``text`` (read from ``where``), refused unless its MAC is ``seed``'s
    and its numbers describe one Poisson sample."""
    try:
      body = json.loads(text)
      if body.pop("format", None) != FORMAT or body.pop("version", None) != VERSION:
        raise ValueError(f"not a manifest of `sparse-dp sample` (format version {VERSION})")
      body["shards"] = tuple(Shard(**{**s, "batch_sizes": tuple(s["batch_sizes"])})
                             for s in body["shards"])
      body["inputs"] = tuple(body["inputs"])
      manifest = cls(**body)
      key = seed.for_sample(manifest.salt)
    except (ValueError, TypeError, KeyError) as error:
      raise ValueError(f"{where}: not a valid sample manifest ({error}); write the sample "
                       "again with `sparse-dp sample`") from None
    if not hmac.compare_digest(manifest.mac, key.mac(manifest._signed_bytes())):
      raise ValueError(f"{where}: the manifest's MAC does not match --seed-file: the manifest "
                       "was edited after it was written (its q or shards cannot be trusted), "
                       "or the sample was drawn with another seed file; give the seed file "
                       "the sample was drawn with, or sample again with `sparse-dp sample`")
    manifest.check_consistent(where)
    return manifest

  def check_consistent(self, where: str) -> None:
    """Refuses a manifest whose numbers do not describe one Poisson sample."""
    problems = []
    if not 0 < self.sampling_rate < 1 or self.sampling_rate != self.batch_size / self.num_examples:
      problems.append(f"sampling_rate {self.sampling_rate} is not batch_size / num_examples "
                      f"= {self.batch_size} / {self.num_examples}")
    covered = [step for shard in self.shards for step in shard.steps]
    if covered != list(range(self.steps)):
      problems.append(f"the shards do not hold steps 0..{self.steps - 1} once each, in order")
    if self.max_batch_size is not None and any(
        size > self.max_batch_size for shard in self.shards for size in shard.batch_sizes):
      problems.append(f"a batch is larger than max_batch_size {self.max_batch_size}")
    if problems:
      raise ValueError(f"{where}: {'; '.join(problems)}; write the sample again with "
                       "`sparse-dp sample`")

  @property
  def batch_sizes(self) -> list[int]:
    return [size for shard in self.shards for size in shard.batch_sizes]


def file_digest(path: str) -> tuple[int, str]:
  """``(bytes, SHA-256 hex)`` of the file at ``path`` (local or any TensorFlow filesystem)."""
  import tensorflow as tf
  digest, size = hashlib.sha256(), 0
  with tf.io.gfile.GFile(path, "rb") as handle:
    while chunk := handle.read(_HASH_CHUNK):
      digest.update(chunk)
      size += len(chunk)
  return size, digest.hexdigest()
