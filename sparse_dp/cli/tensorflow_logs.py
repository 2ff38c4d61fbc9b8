"""TensorFlow's C++ start-up lines, held back from the ``sparse-dp`` command's output.

Importing TensorFlow and initialising its devices writes lines such as
"oneDNN custom operations are on", "Could not find cuda drivers", "Unable to
register cuBLAS factory", "TF-TRT Warning" and the CPU-feature notice to the
process's standard error, from C++. ``TF_CPP_MIN_LOG_LEVEL`` silences them
on TF 2.15, but TF 2.21 logs through absl before its log level is read, so
the command also points file descriptor 2 at a temporary file while
TensorFlow loads and finds its devices, and shows what was written there
only if that fails. A command that compiles its step with XLA (``--jit-compile``) also
compiles a one-line function there: XLA's first compilation in a process writes its own
lines ("Compiled cluster using XLA!", "SetPriority unimplemented for this stream", absl's
"before absl::InitializeLog()"). Later C++ warnings and errors are shown as usual
(``TF_CPP_MIN_LOG_LEVEL=2`` keeps warnings and errors and hides INFO only).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
from typing import Iterator

from sparse_dp._tensorflow_import import TensorFlowImportHook

LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"


@contextlib.contextmanager
def _standard_error_held_back() -> Iterator[None]:
  """Writes to file descriptor 2 go to a temporary file; replayed if the block raises."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as held:
    os.dup2(held.fileno(), 2)
    try:
      yield
    except BaseException:
      os.dup2(saved, 2)
      held.seek(0)
      sys.stderr.write(held.read().decode(errors="replace"))
      raise
    finally:
      os.dup2(saved, 2)
      os.close(saved)


def _load_quietly(load, module, first_xla_compile: bool = False) -> None:
  """Loads TensorFlow and finds its devices (CUDA's probing logs there) with fd 2 held back;
  with ``first_xla_compile``, also compiles a function with XLA."""
  with _standard_error_held_back():
    load(module)
    module.config.list_physical_devices()
    if first_xla_compile:
      module.function(lambda x: x + 1, jit_compile=True)(module.constant(0.0))


def quiet_tensorflow_start_up(first_xla_compile: bool = False) -> None:
  """TensorFlow, when a command first imports it, loads without its start-up lines.

  Commands that never import it (``sparse-dp privacy``) still do not. Leaves
  everything as it is where the user set ``TF_CPP_MIN_LOG_LEVEL``, or where
  TensorFlow is loaded already.

  Args:
    first_xla_compile: the command compiles with XLA: XLA's first-compilation lines are
      held back too.
  """
  if LOG_LEVEL in os.environ or "tensorflow" in sys.modules:
    return
  os.environ[LOG_LEVEL] = "2"
  TensorFlowImportHook(functools.partial(_load_quietly, first_xla_compile=first_xla_compile)
                       ).install()
