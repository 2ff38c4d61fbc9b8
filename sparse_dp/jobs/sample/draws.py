"""Keyed, secret-seeded draws of the Poisson sampler: which steps an example joins.

Every random choice of :mod:`sparse_dp.jobs.sample` is a function of the secret seed, of the
sample's public salt ``s`` and of the example's key ``e = (file name, ordinal)``, never of the
order in which a runner reads the data. Each sample keys its draws with
``K_s = BLAKE2b_key(seed)("salt" | s)`` (:class:`SecretSeed` derives it, a :class:`SampleKey`
draws). Uniforms are ``U_j(e) = (floor(W_j / 2^11) + 1) / 2^53`` from the words ``W_j`` of
``BLAKE2b_key(K_s)("incl" | e | j)``; example ``e`` joins each of the steps ``0 .. T-1`` with
probability ``q`` by geometric skips ``G = floor(ln U / ln(1 - q))`` (Ghazi et al., NeurIPS
2023, §3.3), ``O(1 + T q)`` uniforms per example; a batch larger than ``M`` keeps the ``M``
examples of smallest ``BLAKE2b_key(K_s)("trunc" | step | e)``; the manifest's MAC is
``BLAKE2b_key(K_s)("mac" | manifest)``. See docs/commands/sample.md ("How the sample is
drawn").
"""

from __future__ import annotations

import hashlib
import math
import os
import struct
from typing import Iterator, Optional

SEED_BYTES = 32  # what the refusals suggest writing: 256 bits from /dev/urandom
MIN_SEED_FILE_BYTES = 16  # a seed file must hold at least 128 bits
SALT_BYTES = 16  # a sample's public salt: 128 bits from os.urandom
_WORDS = struct.Struct(">4Q")
_EXAMPLE = struct.Struct(">Q")


def new_salt() -> str:
  """A fresh public salt for one sample (hex), from the OS's cryptographic source."""
  return os.urandom(SALT_BYTES).hex()


class SecretSeed:
  """The sampler's secret, read from a seed file: never written beside the batches, never
  logged; it only derives the key of each sample (:meth:`for_sample`)."""

  def __init__(self, material: bytes):
    if len(material) < MIN_SEED_FILE_BYTES:
      raise ValueError(f"a sampling seed needs at least {MIN_SEED_FILE_BYTES} bytes of secret "
                       f"material, got {len(material)}: write one with "
                       f"`head -c {SEED_BYTES} /dev/urandom > seed`")
    # Any length of material becomes a 32-byte BLAKE2b key.
    self._key = hashlib.blake2b(material, digest_size=32, person=b"sparse-dp-seed").digest()

  @classmethod
  def read(cls, path: str) -> "SecretSeed":
    """The seed in the file ``path`` (its bytes, e.g. from ``/dev/urandom``)."""
    from apache_beam.io.filesystems import FileSystems
    if not FileSystems.exists(path):
      raise ValueError(f"--seed-file {path!r} does not exist: give the seed file of the sample, "
                       f"or write a new one with `head -c {SEED_BYTES} /dev/urandom > {path}` "
                       "(keep it secret)")
    with FileSystems.open(path, compression_type="uncompressed") as handle:
      return cls(handle.read())

  def __repr__(self) -> str:
    return "SecretSeed(<secret>)"

  def for_sample(self, salt: str) -> "SampleKey":
    """``K_s``: the key of every draw of the sample whose public salt is ``salt`` (hex)."""
    try:
      material = bytes.fromhex(salt)
    except (TypeError, ValueError):
      material = b""
    if len(material) != SALT_BYTES:
      raise ValueError(f"a sample's salt is {2 * SALT_BYTES} hex digits, got {salt!r}")
    return SampleKey(hashlib.blake2b(b"salt" + material, key=self._key, digest_size=32).digest())


class SampleKey:
  """``K_s``, the secret key of one sample's draws and of its manifest's MAC."""

  def __init__(self, key: bytes):
    self._key = key

  def __repr__(self) -> str:
    return "SampleKey(<secret>)"

  def _digest(self, message: bytes) -> bytes:
    return hashlib.blake2b(message, key=self._key, digest_size=32).digest()

  def uniforms(self, example: bytes) -> Iterator[float]:
    """``U_1(e), U_2(e), ...``: uniform on ``(0, 1]`` at 53 bits, keyed by ``example``."""
    counter = 0
    while True:
      for word in _WORDS.unpack(self._digest(b"incl" + example + _EXAMPLE.pack(counter))):
        yield ((word >> 11) + 1) / 2.0**53
      counter += 1

  def inclusion_steps(self, example: bytes, sampling_rate: float, steps: int) -> list[int]:
    """The steps in ``[0, steps)`` that ``example`` joins, each with probability ``q``."""
    if not 0 < sampling_rate < 1:
      raise ValueError(f"sampling rate must be in (0, 1), got {sampling_rate}")
    log_miss = math.log1p(-sampling_rate)
    uniforms = self.uniforms(example)
    joined = []
    step = math.floor(math.log(next(uniforms)) / log_miss)
    while step < steps:
      joined.append(step)
      step += 1 + math.floor(math.log(next(uniforms)) / log_miss)
    return joined

  def truncation_priority(self, example: bytes, step: int) -> bytes:
    """``example``'s priority in the truncation of ``step``'s batch (smallest kept)."""
    return self._digest(b"trunc" + _EXAMPLE.pack(step) + example)

  def mac(self, message: bytes) -> str:
    """The MAC (hex) of ``message``, e.g. the sample's manifest."""
    return self._digest(b"mac" + message).hex()


def example_key(file_name: str, ordinal: int) -> bytes:
  """The key of the ``ordinal``-th valid example of the file named ``file_name``."""
  return file_name.encode() + b"\0" + _EXAMPLE.pack(ordinal)


def truncate(key: SampleKey, step: int, examples: list, max_batch_size: Optional[int]):
  """``examples`` (``(key, line)`` pairs) of ``step``, at most ``max_batch_size``, by key order."""
  if max_batch_size is not None and len(examples) > max_batch_size:
    examples = sorted(examples, key=lambda e: key.truncation_priority(e[0], step))
    examples = examples[:max_batch_size]
  return sorted(examples)
