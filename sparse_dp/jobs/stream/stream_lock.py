"""The exclusive lock a ``sparse-dp stream`` job holds on its state folder.

Two jobs on one ``--state`` would each read the same remaining budget and each
spend it. A job therefore holds ``flock(LOCK_EX)`` on ``<state>/stream.lock``
from before it reads ``stream.json`` until it ends. The lock belongs to the
open file, so the operating system releases it when the process ends however
it ends (SIGKILL included): a stale lock file never blocks a resume. The file
is never deleted (deleting a lock file lets a third process lock a new file
while a second still holds the old one).

The holder writes its pid, host, start time and command line into the file;
a job that finds the folder locked waits up to ``--wait-for-lock`` seconds,
then stops naming the holder. ``flock`` is local to one machine's kernel (and
NFS clients with lock support): jobs on one state must share that file system.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import pathlib
import socket
import sys
import time
from typing import Optional

LOCK_FILE = "stream.lock"

# How often a waiting job tries the lock again.
_POLL_SECONDS = 0.1


class StateLockedError(ValueError):
  """Another job holds the state folder's lock."""


class StateLock:
  """``with StateLock(folder, wait_seconds):`` holds ``folder``'s lock for the block."""

  def __init__(self, folder, wait_seconds: float = 0.0):
    if not wait_seconds >= 0:
      raise ValueError(f"--wait-for-lock must be >= 0 seconds, got {wait_seconds}")
    self.path = pathlib.Path(folder) / LOCK_FILE
    self.wait_seconds = wait_seconds
    self._descriptor: Optional[int] = None

  def __enter__(self) -> "StateLock":
    self.path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + self.wait_seconds
    while not _try_lock(descriptor):
      if time.monotonic() >= deadline:
        os.close(descriptor)
        waited = f" after waiting {self.wait_seconds:g} s" if self.wait_seconds else ""
        raise StateLockedError(
            f"{self.path.parent} is in use by another stream job{waited} "
            f"({describe_holder(self.path)}); wait for it (--wait-for-lock SECONDS) or give "
            "another --state")
      time.sleep(_POLL_SECONDS)
    holder = {"pid": os.getpid(), "host": socket.gethostname(),
              "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(sys.argv)}
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, json.dumps(holder).encode(), 0)
    self._descriptor = descriptor
    return self

  def __exit__(self, *_) -> None:
    os.ftruncate(self._descriptor, 0)  # the record names a running job only
    os.close(self._descriptor)  # releases the lock
    self._descriptor = None


def _try_lock(descriptor: int) -> bool:
  try:
    fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except OSError as error:
    if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
      return False
    raise
  return True


def describe_holder(path: pathlib.Path) -> str:
  """``pid 123 on host h, started <time>: <command>`` from the lock file at ``path``."""
  try:
    holder = json.loads(path.read_text())
  except (OSError, ValueError):  # the holder has not written its record yet
    return "a job that has not yet written its pid"
  return (f"pid {holder['pid']} on host {holder['host']}, started {holder['started']}: "
          f"{holder['command']}")
