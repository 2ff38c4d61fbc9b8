"""TensorFlow's C++ start-up lines, held back from the ``sparse-dp`` command's output.

Importing TensorFlow and initialising its devices writes lines ("oneDNN custom operations are
on", "Could not find cuda drivers", ...) to standard error from C++, and TF 2.21 logs them
through absl before ``TF_CPP_MIN_LOG_LEVEL`` is read. So the command points file descriptor 2
at a temporary file while TensorFlow loads, finds its devices and compiles a one-line function
with XLA (whose first compilation writes lines of its own), and shows what was written there
only if that fails. Later C++ warnings and errors are shown as usual. See
docs/getting-started.md ("TensorFlow's start-up lines").
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
