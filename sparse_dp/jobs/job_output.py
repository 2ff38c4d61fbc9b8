"""Where a job's progress goes: stdout, or stderr when stdout carries one JSON object."""

from __future__ import annotations

import contextlib
import sys


def progress_output(json_output: bool):
  """Sends progress to stderr when stdout must carry one JSON object (``--json``).

  Args:
    json_output: whether the job prints its result as JSON on stdout.

  Returns:
    A context manager for the job's progress lines.
  """
  return contextlib.redirect_stdout(sys.stderr) if json_output else contextlib.nullcontext()
