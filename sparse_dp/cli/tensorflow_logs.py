"""TensorFlow's C++ start-up lines, held back from the ``sparse-dp`` command's output.

Importing TensorFlow and initialising its devices writes lines such as
"oneDNN custom operations are on", "Could not find cuda drivers", "Unable to
register cuBLAS factory", "TF-TRT Warning" and the CPU-feature notice to the
process's standard error, from C++. ``TF_CPP_MIN_LOG_LEVEL`` silences them
on TF 2.15, but TF 2.21 logs through absl before its log level is read, so
the command also points file descriptor 2 at a temporary file while
TensorFlow loads and finds its devices, and shows what was written there
only if that fails. It also compiles a one-line function with XLA there: XLA's first
compilation in a process writes lines of its own ("Compiled cluster using XLA!", on TF 2.15
an E-level "SetPriority unimplemented for this stream" and absl's "before
absl::InitializeLog()"), and every training command compiles with XLA (the weight
fingerprint of ``make_private``; the step with ``--jit-compile``). Later C++ warnings and
errors are shown as usual
(``TF_CPP_MIN_LOG_LEVEL=2`` keeps warnings and errors and hides INFO only).
"""

from __future__ import annotations

import contextlib
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


def _load_quietly(load, module) -> None:
  """Loads TensorFlow, finds its devices (CUDA's probing logs there) and compiles one function
  with XLA (its first compilation logs there), with fd 2 held back."""
  with _standard_error_held_back():
    load(module)
    module.config.list_physical_devices()
    module.function(lambda x: x + 1, jit_compile=True)(module.constant(0.0))


def quiet_tensorflow_start_up() -> None:
  """TensorFlow, when a command first imports it, loads without its start-up lines.

  Commands that never import it (``sparse-dp privacy``) still do not. Leaves
  everything as it is where the user set ``TF_CPP_MIN_LOG_LEVEL``, or where
  TensorFlow is loaded already.
  """
  if LOG_LEVEL in os.environ or "tensorflow" in sys.modules:
    return
  os.environ[LOG_LEVEL] = "2"
  TensorFlowImportHook(_load_quietly).install()
