"""Which task of a ``TF_CONFIG`` cluster this process is, and where it writes its outputs.

Under ``MultiWorkerMirroredStrategy`` every worker runs the same command, so
each would write the same ``--out`` (or stream ``--state``) at once: the
model, the metrics, the synthetic data, a stream's ledger and its lock. As
Keras's ``ModelCheckpoint`` does for such clusters, only the chief writes the
folder it was given; every other task writes a folder of its own inside it,
``workers/<type>_<index>`` (kept: it holds that worker's copy of a stream's
state for its next period). The chief is the ``chief`` task, or worker 0 of
a cluster without one (``TF_CONFIG``'s convention); a process without
``TF_CONFIG`` is its own chief.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Optional


def cluster_task() -> Optional[tuple[str, int]]:
  """``(task type, index)`` of this process in ``TF_CONFIG``'s cluster; ``None`` without one."""
  config = os.environ.get("TF_CONFIG")
  if not config:
    return None
  try:
    task = json.loads(config)["task"]
    return str(task["type"]), int(task.get("index", 0))
  except (ValueError, KeyError, TypeError) as error:
    raise ValueError(f"TF_CONFIG must be JSON with a task {{\"type\", \"index\"}}, got "
                     f"{config!r}") from error


def is_chief() -> bool:
  """Whether this process writes the outputs of the cluster's job."""
  task = cluster_task()
  if task is None:
    return True
  cluster = json.loads(os.environ["TF_CONFIG"]).get("cluster", {})
  kind, index = task
  return kind == "chief" or (kind == "worker" and index == 0 and not cluster.get("chief"))


def output_folder(folder: pathlib.Path) -> pathlib.Path:
  """``folder`` for the chief; ``folder/workers/<type>_<index>`` for any other task."""
  if is_chief():
    return folder
  kind, index = cluster_task()
  return folder / "workers" / f"{kind}_{index}"
