"""Which examples a model was trained on, by content: testable only with a key kept out of it.

``sparse-dp train`` writes beside the saved model :data:`FILE`, a keyed hash of
each training example's 39 features (the label left out), and :data:`KEY_ID_FILE`, the key's
id. The key is a fresh 256-bit secret per folder, written (mode 0600) to ``<key id>.key`` in
the user's secrets folder (:func:`secrets_dir`), never inside the folder.
``sparse-dp distill --teacher`` finds the key by its id, hashes its distillation inputs the
same way and refuses those in the record. Each example's content digest
(:func:`feature_hashes`, 64 bits, never written) is hashed with keyed BLAKE2b (8 bytes)
together with its occurrence among equal digests: among ``n`` recorded and ``m`` checked
examples the chance that any one is refused wrongly is at most ``n m 2^-63``; a training
example is never missed. See docs/commands/train.md ("The data").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import secrets
from typing import Optional

import numpy as np
import pandas as pd

from sparse_dp.data.criteo_format import CATEGORICAL_NAMES, INTEGER_NAMES

FILE = "training_examples_keyed.npy"  # the keyed hashes, sorted (uint64)
KEY_ID_FILE = "training_examples_keyed.json"  # the key's id (a hash of the key, not the key)
LEGACY_FILE = "training_examples.npy"  # unkeyed hashes of earlier versions: refused
SECRETS_ENV = "SPARSE_DP_SECRETS_DIR"
DEFAULT_SECRETS_DIR = "~/.sparse_dp/keys"
WHERE_KEYS_ARE = f"--secrets-dir, else ${SECRETS_ENV}, else {DEFAULT_SECRETS_DIR}"
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)  # odd: 2^64 / golden ratio
_KEY_BYTES = 32
_KEY_ID_DOMAIN = b"sparse-dp training-examples key id\x00"
_SCHEME = ("keyed BLAKE2b-64 of (the example's 64-bit feature digest, its occurrence among "
           "equal digests); the key is not in this folder")


def feature_hashes(frame: pd.DataFrame) -> np.ndarray:
  """One uint64 per row of ``frame`` (a :class:`CriteoReader` frame): the digest of its features.

  Each column's values are hashed (``pd.util.hash_array``, SipHash-2-4 with its
  fixed key), and the row's ``k`` column hashes ``h_i`` combined as
  ``sum_i h_i M^(k-1-i) mod 2^64`` with an odd ``M`` (invertible mod ``2^64``, so
  any one column's hash moves the row's uniformly: distinct rows collide with
  probability ``2^-64``). Unkeyed: anyone with the data can compute it, so it is
  never written; :func:`save` writes a keyed hash of it.

  Args:
    frame: the examples, integers as float64 (NaN: missing), categorical values as
      strings (``None``: missing), as :class:`~sparse_dp.data.criteo.CriteoReader` reads them.

  Returns:
    uint64 ``[len(frame)]``.
  """
  columns = ([frame[name].to_numpy(np.float64) for name in INTEGER_NAMES]
             + [frame[name].to_numpy(object) for name in CATEGORICAL_NAMES])
  row = np.zeros(len(frame), np.uint64)
  with np.errstate(over="ignore"):
    for values in columns:
      row = row * _MULTIPLIER + pd.util.hash_array(values, categorize=False)
  return row


def secrets_dir(flag: Optional[str] = None) -> pathlib.Path:
  """Where record keys live: ``flag`` (``--secrets-dir``), else ``$SPARSE_DP_SECRETS_DIR``,
  else ``~/.sparse_dp/keys``."""
  return pathlib.Path(flag or os.environ.get(SECRETS_ENV) or DEFAULT_SECRETS_DIR).expanduser()


def key_id(key: bytes) -> str:
  """The id of ``key``: 128 bits of a SHA-256 of it (which tells nothing of the key)."""
  return hashlib.sha256(_KEY_ID_DOMAIN + key).hexdigest()[:32]


def keyed_hashes(frame: pd.DataFrame, key: bytes) -> np.ndarray:
  """The sorted keyed hashes of ``frame``'s examples, each duplicate hashed apart."""
  digests = np.sort(feature_hashes(frame))
  index = np.arange(len(digests))
  first = np.r_[True, digests[1:] != digests[:-1]] if len(digests) else np.zeros(0, bool)
  occurrence = index - np.maximum.accumulate(np.where(first, index, 0))
  return np.sort(_keyed(digests, occurrence.astype(np.uint64), key))


def _keyed(digests: np.ndarray, occurrences: np.ndarray, key: bytes) -> np.ndarray:
  pairs = np.stack([digests.astype("<u8"), occurrences.astype("<u8")], axis=1).tobytes()
  keyed = hashlib.blake2b(key=key, digest_size=8)
  out = bytearray()
  for start in range(0, len(pairs), 16):
    one = keyed.copy()
    one.update(pairs[start:start + 16])
    out += one.digest()
  return np.frombuffer(bytes(out), "<u8").astype(np.uint64)


def refuse_secrets_inside(secrets: pathlib.Path, folder: pathlib.Path, what: str) -> None:
  """Refuses a secrets folder that is ``folder`` or inside it (``what``: the flag of ``folder``)."""
  inner, outer = secrets.expanduser().resolve(), pathlib.Path(folder).resolve()
  if inner == outer or outer in inner.parents:
    raise ValueError(
        f"the secrets folder {str(secrets)!r} is inside {what} {str(folder)!r}: the key of the "
        "training examples' record must stay out of the folder that is released (with it, "
        "anyone can test whether an example was trained on); give --secrets-dir (or "
        f"${SECRETS_ENV}) a folder outside it (default {DEFAULT_SECRETS_DIR})")


def save(frame: pd.DataFrame, folder: pathlib.Path, secrets_folder: pathlib.Path) -> pathlib.Path:
  """Writes the keyed record of ``frame``'s examples to ``folder`` and its new key to
  ``secrets_folder`` (created 0700; the key file 0600).

  Args:
    frame: the training examples (a :class:`~sparse_dp.data.criteo.CriteoReader` frame).
    folder: the output folder (``--out``), which gets :data:`FILE` and :data:`KEY_ID_FILE`.
    secrets_folder: where the key goes (:func:`secrets_dir`), outside ``folder``.

  Returns:
    The key file's path.

  Raises:
    ValueError: ``secrets_folder`` is ``folder`` or inside it.
  """
  folder, secrets_folder = pathlib.Path(folder), pathlib.Path(secrets_folder).expanduser()
  refuse_secrets_inside(secrets_folder, folder, "the output folder")
  remove_stale(folder)
  key = secrets.token_bytes(_KEY_BYTES)
  identifier = key_id(key)
  secrets_folder.mkdir(mode=0o700, parents=True, exist_ok=True)
  key_path = secrets_folder / f"{identifier}.key"
  handle = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
  with os.fdopen(handle, "w") as out:
    out.write(key.hex() + "\n")
  np.save(folder / FILE, keyed_hashes(frame, key))
  (folder / KEY_ID_FILE).write_text(json.dumps({"key_id": identifier, "hash": _SCHEME}, indent=2))
  return key_path


def remove_stale(folder: pathlib.Path) -> list[str]:
  """Deletes a record an earlier run left in ``folder`` (keyed, or the unkeyed
  :data:`LEGACY_FILE`); returns the names deleted."""
  removed = []
  for name in (FILE, KEY_ID_FILE, LEGACY_FILE):
    path = pathlib.Path(folder) / name
    if path.is_file():
      path.unlink()
      removed.append(name)
  return removed


@dataclasses.dataclass(frozen=True)
class Record:
  """The keyed hashes of a teacher's training examples, with the key that tests them."""

  key: bytes
  hashes: np.ndarray  # sorted uint64

  @classmethod
  def of(cls, frame: pd.DataFrame) -> "Record":
    """The record of ``frame``'s examples under a fresh key, held in memory only."""
    key = secrets.token_bytes(_KEY_BYTES)
    return cls(key, keyed_hashes(frame, key))

  def count_in(self, frame: pd.DataFrame) -> int:
    """How many examples of ``frame`` have the features of a recorded example."""
    digests = feature_hashes(frame)
    first = _keyed(digests, np.zeros(len(digests), np.uint64), self.key)
    return int(np.isin(first, self.hashes).sum())


def load(folder: pathlib.Path, secrets_folder: pathlib.Path) -> Record:
  """The record ``sparse-dp train`` wrote in ``folder``, with its key from ``secrets_folder``.

  Args:
    folder: a ``sparse-dp train`` output folder (``--teacher``).
    secrets_folder: where to find the key by its id (:func:`secrets_dir`).

  Returns:
    The record, which tests examples with :meth:`Record.count_in`.

  Raises:
    ValueError: ``folder`` holds the unkeyed :data:`LEGACY_FILE`, or no record, or the
      key is not in ``secrets_folder`` (or is not the record's), or ``secrets_folder``
      is inside ``folder``.
  """
  folder, secrets_folder = pathlib.Path(folder), pathlib.Path(secrets_folder).expanduser()
  legacy = folder / LEGACY_FILE
  if legacy.is_file():
    raise ValueError(
        f"{str(folder)!r} holds {LEGACY_FILE}, an unkeyed hash of every training example "
        "written by an earlier 'sparse-dp train': whoever has the training data can test "
        f"with it whether an example was trained on. Delete {str(legacy)!r} (and any copy "
        "released with the folder) and retrain with 'sparse-dp train', which writes a keyed "
        "record whose key stays out of the folder; this old record is not used")
  path, id_path = folder / FILE, folder / KEY_ID_FILE
  if not path.is_file() or not id_path.is_file():
    raise ValueError(
        f"{str(folder)!r} has no record of its training examples ({FILE}, {KEY_ID_FILE}), so "
        "distillation inputs cannot be checked to be other data: retrain it with 'sparse-dp "
        "train --reader pandas' (the default), which writes the record")
  refuse_secrets_inside(secrets_folder, folder, "--teacher")
  identifier = str(json.loads(id_path.read_text()).get("key_id", ""))
  key_path = secrets_folder / f"{identifier}.key"
  if not identifier.isalnum() or not key_path.is_file():
    raise ValueError(
        f"the training-example record of {str(folder)!r} is keyed, and its key "
        f"{identifier}.key is not in {str(secrets_folder)!r} ({WHERE_KEYS_ARE}): point "
        f"--secrets-dir (or ${SECRETS_ENV}) at the folder where 'sparse-dp train' wrote it "
        "on the machine that trained the teacher, or pass --skip-teacher-data-check to "
        "distil without checking that the distillation inputs are not the teacher's "
        "training examples (the report then says the check was skipped)")
  key = bytes.fromhex(key_path.read_text().strip())
  if key_id(key) != identifier:
    raise ValueError(f"{str(key_path)!r} is not the key of {str(folder)!r}'s record (its id is "
                     f"{key_id(key)}, the record's {identifier})")
  hashes = np.load(path, allow_pickle=False)
  if hashes.dtype != np.uint64 or hashes.ndim != 1:
    raise ValueError(f"{path} is not a record of training examples (uint64 hashes)")
  return Record(key, hashes)
