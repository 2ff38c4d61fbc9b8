"""The samples drawn with one seed file, in a ledger beside it: no sample is drawn twice.

A sample's batches are a function of the secret seed and of its public salt
(:mod:`sparse_dp.jobs.sample.draws`). Every ``sparse-dp sample`` draws a fresh
salt, so two samples drawn with one seed file share no batch; but one salt
drawn again gives the same batches, and a second folder of them carries claims
of its own (:mod:`sparse_dp.jobs.sample.step_claims`): a model could then train again
on batches its accountant counted as fresh Poisson steps. The ledger,
``<seed file>.samples/`` beside the seed file, holds one file per salt drawn
with that seed, ``<salt>.json``, which names the folder of its sample:

* ``sparse-dp sample`` creates its salt's entry (exclusively, as a claim is
  created: a salt already there is refused) before anything is drawn;
* ``sparse-dp sample --reproduce FOLDER``, the one way to draw a salt again,
  redraws the sample of FOLDER's manifest into FOLDER itself, under its claims,
  and is refused unless the ledger names FOLDER for that salt (a copy of the
  manifest elsewhere is not where the sample's claims are).

Folders are compared as written, made absolute when local: the same folder
under another name (a symlink, a bucket's mount) is refused, never wrongly
accepted.
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
