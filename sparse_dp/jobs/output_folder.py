"""A job's ``--out`` folder: new or empty, or an earlier run's cleared by ``--overwrite``.

A job never writes into a folder that holds something, so nothing a user wrote is lost
and no stale file of an earlier run is mistaken for this one's. A run marks its folder
(:data:`RUN_MARKER`) when it starts and lists there what it wrote when it ends
(:func:`record_outputs`); ``--overwrite`` deletes those entries and refuses a folder that
holds any other (an unfinished run's folder, whose marker lists nothing, is cleared). A
folder that holds the marker alone (a run refused before it wrote anything) counts as empty.
"""

from __future__ import annotations

import pathlib
import shutil
from typing import Sequence

RUN_MARKER = ".sparse-dp-run"


def claim_output_folder(folder: pathlib.Path, overwrite: bool, command: str,
                        keep: Sequence[str] = ()) -> None:
  """Makes ``folder`` this run's, before the run reads or writes any data.

  Args:
    folder: the run's output folder (``--out``).
    overwrite: ``--overwrite``: clear an earlier run's folder first.
    command: the job's name, written into the marker (``sparse-dp train``).
    keep: entries that are not the run's to check or clear (the cluster's
      ``workers`` folder, which each worker claims for itself).

  Raises:
    ValueError: ``folder`` is a file; or it holds entries and ``overwrite`` is off; or
      ``overwrite`` is on and ``folder`` holds entries but no run's marker.
  """
  if folder.exists() and not folder.is_dir():
    raise ValueError(f"--out {folder} is a file: give a folder")
  entries = sorted(entry.name for entry in folder.iterdir()
                   if entry.name not in keep) if folder.is_dir() else []
  if entries and entries != [RUN_MARKER]:  # a marker alone: an earlier run wrote nothing
    shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
    if not overwrite:
      raise ValueError(f"--out {folder} already holds {shown}: give a new or empty folder, "
                       "or add --overwrite to clear an earlier run's folder first")
    if RUN_MARKER not in entries:
      raise ValueError(f"--out {folder} holds {shown}, which no sparse-dp run wrote: "
                       "--overwrite clears only an earlier run's folder; give another --out")
    written = (folder / RUN_MARKER).read_text().splitlines()[1:]
    others = [name for name in entries if written and name not in written + [RUN_MARKER]]
    if others:
      raise ValueError(f"--out {folder} holds {', '.join(others[:3])} beside the earlier "
                       "run's outputs, which that run did not write: --overwrite clears only "
                       "what a run wrote; move them, or give another --out")
    for name in entries:
      entry = folder / name
      shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
  folder.mkdir(parents=True, exist_ok=True)
  (folder / RUN_MARKER).write_text(f"{command}\n")


def record_outputs(folder: pathlib.Path, command: str, keep: Sequence[str] = ()) -> None:
  """Lists in ``folder``'s marker the entries the run wrote there, as it ends.

  Args:
    folder: the run's output folder, claimed by :func:`claim_output_folder`.
    command: the job's name, the marker's first line.
    keep: entries that are not the run's (as in :func:`claim_output_folder`).
  """
  written = sorted(entry.name for entry in folder.iterdir()
                   if entry.name not in (*keep, RUN_MARKER))
  (folder / RUN_MARKER).write_text("\n".join([command, *written]) + "\n")
