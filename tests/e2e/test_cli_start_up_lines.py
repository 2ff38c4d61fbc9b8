"""The ``sparse-dp`` command hides TensorFlow's C++ start-up lines unless asked."""

import os
import re
import subprocess
import sys

import pytest

# TF 2.15 ("2026-11-26 00:37:10.471134: I tensorflow/...") and TF 2.21 absl ("I0000 00:00:...").
CPP_LOG_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: [IWEF] |[IWEF]\d{4} \d\d:\d\d)",
                          re.MULTILINE)
PRIVACY = ["privacy", "--algorithm", "dpsgd", "--num-examples", "1000", "--batch-size", "10",
           "--steps", "10", "--noise-multiplier", "1"]


def _run(tmp_path, code: str) -> tuple[list, str]:
  """``(stdout lines, stderr)`` of Python running ``code`` in a fresh process, with
  ``TF_CPP_MIN_LOG_LEVEL`` unset as a user's shell has it."""
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        cwd=tmp_path, env=env, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  return done.stdout.strip().splitlines(), done.stderr


def _stderr(tmp_path, *flags: str) -> str:
  """Standard error of the command (here ``privacy``) followed by TensorFlow's first use."""
  out, stderr = _run(tmp_path, "import sys\nfrom sparse_dp.cli import main\n"
                     f"assert main({PRIVACY + list(flags)!r}) == 0\n"
                     "assert 'tensorflow' not in sys.modules  # privacy never loads it\n"
                     "import tensorflow as tf\nprint(float(tf.constant(1.0) + 1))\n")
  assert out[-1].endswith("2.0")
  return stderr


@pytest.mark.slow
def test_start_up_lines_are_hidden_and_shown_with_verbose(tmp_path):
  assert not CPP_LOG_LINE.search(_stderr(tmp_path))
  # This machine's TensorFlow logs at start-up (no CUDA drivers, oneDNN): --verbose shows it.
  assert CPP_LOG_LINE.search(_stderr(tmp_path, "--verbose"))


def _compiled_stderr(tmp_path, quiet: bool) -> tuple[str, str]:
  """Standard error and TF version of a process that compiles with XLA, as ``make_private``'s
  weight fingerprint does: after the command's quiet start-up, or with the log level only."""
  start = ("from sparse_dp.cli import tensorflow_logs\n"
           "tensorflow_logs.quiet_tensorflow_start_up()\n" if quiet else
           "import os\nos.environ['TF_CPP_MIN_LOG_LEVEL'] = '2'\n")
  out, stderr = _run(tmp_path, start + "import tensorflow as tf\n"
                     "print(float(tf.function(lambda x: x * 2, jit_compile=True)"
                     "(tf.constant(1.0))))\nprint(tf.__version__)\n")
  assert out[0] == "2.0"
  return stderr, out[1]


@pytest.mark.slow
def test_xlas_first_compilation_lines_are_held_back_with_the_start_ups(tmp_path):
  """Every training command compiles with XLA (``make_private``'s weight fingerprint; the step
  with ``--jit-compile``): XLA's once-a-process lines ("Compiled cluster using XLA!", and on
  TF 2.15 an E-level "SetPriority unimplemented") are held back with the start-up's."""
  stderr, _ = _compiled_stderr(tmp_path, quiet=True)
  assert not CPP_LOG_LINE.search(stderr), stderr
  stderr, version = _compiled_stderr(tmp_path, quiet=False)
  if version.startswith("2.15"):  # TF 2.21 writes none at its first compilation
    assert "Compiled cluster using XLA" in stderr
