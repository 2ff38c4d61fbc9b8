"""The batches of a Poisson sample that training runs have taken, so none trains twice.

Amplification by subsampling assumes each sampled batch is released through one training
step: two runs on the same batches are together one subsampled Gaussian of noise multiplier
``sigma / sqrt(2)`` per step, whose epsilon can exceed the sum of the two runs' printed
epsilons. So a run claims the steps it will train before it reads them, by creating
``claims/from-<first step>.json`` in the sample's folder, and a later run (in this process or
another) starts after the last claimed step. On a local folder the create is exclusive; on a
remote filesystem (``gs://...``) the check and the write are two calls, not one atomic
create. The guarantee is per folder. See docs/commands/sample.md.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import posixpath

import tensorflow as tf

CLAIMS = "claims"


@dataclasses.dataclass(frozen=True)
class Claim:
  """Steps ``first .. end - 1`` of the sample, taken by one training run."""

  first: int
  end: int
  claimed_at: str


def claims(folder: str) -> list[Claim]:
  """The claims recorded in the sample ``folder``, by first step; an unreadable one is
  refused by its path (it may hold steps a run trained on)."""
  directory = posixpath.join(folder, CLAIMS)
  if not tf.io.gfile.isdir(directory):
    return []
  found = []
  for name in tf.io.gfile.listdir(directory):
    if not (name.startswith("from-") and name.endswith(".json")):
      continue
    path = posixpath.join(directory, name)
    try:
      with tf.io.gfile.GFile(path) as handle:
        found.append(Claim(**json.load(handle)))
      if not 0 <= found[-1].first < found[-1].end:
        raise ValueError(f"steps {found[-1].first}..{found[-1].end}")
    except (ValueError, TypeError) as error:
      raise ValueError(f"--data {folder!r}: the claim {path} is not readable ({error}); which "
                       "batches runs trained on is unknown, so none can be trained on again: "
                       "sample again with `sparse-dp sample` (a fresh salt: new batches)") from None
  return sorted(found, key=lambda c: c.first)


def steps_taken(folder: str) -> int:
  """The first step no run has claimed (0 for a fresh sample)."""
  return max((c.end for c in claims(folder)), default=0)


def claim(folder: str, first: int, end: int) -> Claim:
  """Records that this run trains on steps ``first .. end - 1``; refuses steps another
  run claimed first."""
  taken = Claim(first, end, datetime.datetime.now(datetime.timezone.utc).isoformat())
  path = posixpath.join(folder, CLAIMS, f"from-{first:09d}.json")
  try:
    tf.io.gfile.makedirs(posixpath.dirname(path))
    created = create_new(path, json.dumps(dataclasses.asdict(taken)))
  except (OSError, tf.errors.OpError) as error:
    raise ValueError(f"--data {folder!r}: cannot record which batches this run trains on "
                     f"({path}: {error}); the sample folder must be writable so that no "
                     "batch is trained on twice: copy the whole folder somewhere "
                     "writable") from error
  if not created:
    raise ValueError(f"--data {folder!r}: another training run claimed the sample's batches "
                     f"from step {first} at the same time ({path}); a batch used twice is "
                     "not a Poisson sample: run one job per sample, or sample again (a fresh "
                     "salt: new batches)")
  return taken


def create_new(path: str, text: str) -> bool:
  """Writes ``text`` to ``path`` unless it exists (False then). Locally the file appears
  whole and only once: written beside it, then hard-linked to its name (``link`` fails
  if the name exists), so a run killed mid-write leaves no partial claim."""
  if "://" in path:
    if tf.io.gfile.exists(path):
      return False
    with tf.io.gfile.GFile(path, "w") as handle:
      handle.write(text)
    return True
  partial = f"{path}.{os.getpid()}.partial"
  with open(partial, "w") as handle:
    handle.write(text)
  try:
    os.link(partial, path)
  except FileExistsError:
    return False
  finally:
    os.unlink(partial)
  return True
