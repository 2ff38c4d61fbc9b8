"""Where a job's progress goes: stdout, or stderr when stdout carries one JSON object."""

from __future__ import annotations

import contextlib
import sys
import time


def progress_output(json_output: bool):
  """Sends progress to stderr when stdout must carry one JSON object (``--json``).

  Args:
    json_output: whether the job prints its result as JSON on stdout.

  Returns:
    A context manager for the job's progress lines.
  """
  return contextlib.redirect_stdout(sys.stderr) if json_output else contextlib.nullcontext()


class Phases:
  """Seconds of a job's phases, each announced on the progress output as it starts and ends.

  Args:
    job: the job's name, which starts each line (``sparse-dp train``).
  """

  def __init__(self, job: str):
    self.job = job
    self.seconds: dict[str, float] = {}

  @contextlib.contextmanager
  def phase(self, name: str):
    """Times the phase ``name`` (added to an earlier phase of that name)."""
    print(f"{self.job}: {name} ...", flush=True)
    start = time.perf_counter()
    yield
    took = time.perf_counter() - start
    self.seconds[name] = self.seconds.get(name, 0.0) + took
    print(f"{self.job}: {name} took {took:.1f} s", flush=True)
