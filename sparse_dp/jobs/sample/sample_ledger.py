"""The samples drawn with one seed file, in a ledger beside it: no sample is drawn twice.

A sample's batches are a function of the secret seed and of its public salt
(:mod:`sparse_dp.jobs.sample.draws`), so one salt drawn again would give the same batches
under claims of their own (:mod:`sparse_dp.jobs.sample.step_claims`). The ledger,
``<seed file>.samples/``, holds one ``<salt>.json`` per salt drawn with that seed, naming the
folder of its sample: ``sparse-dp sample`` creates its salt's entry exclusively before
anything is drawn, and ``sparse-dp sample --reproduce FOLDER`` is refused unless the ledger
names FOLDER for that salt. Folders are compared as written (absolute when local), so the
same folder under another name is refused, never wrongly accepted. See
docs/commands/sample.md ("How the sample is drawn").
"""

from __future__ import annotations

import datetime
import json
import os
import posixpath

import tensorflow as tf

from sparse_dp.jobs.sample.step_claims import create_new

LEDGER_SUFFIX = ".samples"


def ledger_folder(seed_file: str) -> str:
  """The ledger of the samples drawn with ``seed_file``: a folder beside it."""
  return seed_file.rstrip("/") + LEDGER_SUFFIX


def _entry_path(seed_file: str, salt: str) -> str:
  return posixpath.join(ledger_folder(seed_file), f"{salt}.json")


def _sample_folder(out: str) -> str:
  """``out`` as the ledger records it: absolute when local."""
  return out if "://" in out else os.path.abspath(out)


def record(seed_file: str, salt: str, out: str) -> None:
  """Records that the sample of ``salt`` is drawn into ``out``; refuses a salt drawn before."""
  path = _entry_path(seed_file, salt)
  entry = {"salt": salt, "out": _sample_folder(out),
           "drawn_at": datetime.datetime.now(datetime.timezone.utc).isoformat()}
  try:
    tf.io.gfile.makedirs(ledger_folder(seed_file))
    created = create_new(path, json.dumps(entry))
  except (OSError, tf.errors.OpError) as error:
    raise ValueError(f"--seed-file {seed_file!r}: cannot record the sample in the ledger beside "
                     f"it ({path}: {error}); the seed file's folder must be writable, so that "
                     "no sample is drawn twice") from error
  if not created:
    raise ValueError(f"--seed-file {seed_file!r}: the salt {salt} was drawn before ({path}); "
                     "one salt drawn twice gives the same batches: sample again with "
                     "`sparse-dp sample` (a fresh salt)")


def check_reproduction(seed_file: str, salt: str, folder: str) -> None:
  """Refuses to redraw the sample of ``salt`` anywhere but the folder it was drawn into."""
  path = _entry_path(seed_file, salt)
  if not tf.io.gfile.exists(path):
    raise ValueError(f"--reproduce {folder!r}: the ledger beside --seed-file {seed_file!r} has "
                     f"no sample of salt {salt} ({path}); only a sample drawn with this seed "
                     "file can be reproduced, into its own folder")
  with tf.io.gfile.GFile(path) as handle:
    drawn_into = json.load(handle)["out"]
  if drawn_into != _sample_folder(folder):
    raise ValueError(f"--reproduce {folder!r}: the sample of salt {salt} was drawn into "
                     f"{drawn_into!r} ({path}); a copy elsewhere would hold its batches without "
                     "its claims (a batch trained on twice is not a Poisson sample): reproduce "
                     f"it into {drawn_into!r}, or sample again with `sparse-dp sample` (a fresh "
                     "salt: new batches)")
