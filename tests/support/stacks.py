"""The two supported stacks, the markers that place a test on one, and the suite's ALPHA.

* Python 3.10-3.11: TF 2.15.1 with TF Privacy 0.9.0 (``"tf2.15"``);
* Python 3.12-3.13: TF 2.21.0 with tf-keras (``"tf2.21"``), no TF Privacy.

CI runs the fast tier on both stacks and the slow tier once, its tests split
between the stacks (``one_stack`` pins one; ``tests/conftest.py`` places the others).
``SPARSE_DP_ALL_STACKS=1`` runs every test on the stack at hand.
"""

import importlib.metadata
import os
import sys

import pytest

# setup.py installs TF Privacy 0.9.0 on the Python 3.10-3.11 stack only; there
# its tests must run (an import error fails them), on Python 3.12+ they skip.
TF_PRIVACY_STACK = sys.version_info < (3, 12)
NO_TF_PRIVACY = ("TF Privacy is not in the Python 3.12+ stack (TF 2.21): TF Privacy 0.9.0 "
                 "caps TensorFlow <= 2.15 and Python < 3.12; this check runs on Python 3.11")
requires_tf_privacy = pytest.mark.skipif(not TF_PRIVACY_STACK, reason=NO_TF_PRIVACY)

# The PLD builder of sparse_dp.accounting.gaussian_pld takes dp-accounting 0.4.3's floating-
# point steps (the 3.11 stack's): the same bits there, the same to float rounding on 0.6.
SAME_PLD_BITS = importlib.metadata.version("dp-accounting") == "0.4.3"

STACKS = ("tf2.15", "tf2.21")
STACK = STACKS[0] if TF_PRIVACY_STACK else STACKS[1]

# False-failure probability of every statistical test in this suite. Each test
# uses a fixed seed, so it passes or fails deterministically; this is the
# chance that a correct implementation would fail for a random seed.
ALPHA = 1e-6


def one_stack(stack: str):
  """Runs a slow test only on ``stack`` ("tf2.15": Python 3.10-3.11, "tf2.21": 3.12+).

  ``tests/conftest.py`` gives every other slow test a stack in turn; this pins one.

  Args:
    stack: one of :data:`STACKS`.

  Returns:
    A ``stack`` mark, which skips the test elsewhere unless ``SPARSE_DP_ALL_STACKS=1``.
  """
  if stack not in STACKS:
    raise ValueError(f"stack must be one of {STACKS}, got {stack!r}")
  return pytest.mark.stack(stack)


def skip_elsewhere(stack: str):
  """The ``skipif`` mark running a test on ``stack`` only (lifted by ``SPARSE_DP_ALL_STACKS=1``)."""
  return pytest.mark.skipif(
      stack != STACK and os.environ.get("SPARSE_DP_ALL_STACKS") != "1",
      reason=f"a slow test CI runs on the {stack} stack; SPARSE_DP_ALL_STACKS=1 runs it here")
