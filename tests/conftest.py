"""Shared test settings: quiet TensorFlow, one fixed seed per test.

``sparse_dp`` is imported before any test module imports TensorFlow or TFRS,
as the README asks: on TF 2.16+ that makes ``tf.keras`` Keras 2, which TFRS
requires (tests/test_stack.py checks the other orders).
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

import sparse_dp  # noqa: E402,F401

# setup.py installs TF Privacy 0.9.0 on the Python 3.10-3.11 stack only; there
# its tests must run (an import error fails them), on Python 3.12+ they skip.
TF_PRIVACY_STACK = sys.version_info < (3, 12)
NO_TF_PRIVACY = ("TF Privacy is not in the Python 3.12+ stack (TF 2.21): TF Privacy 0.9.0 "
                 "caps TensorFlow <= 2.15 and Python < 3.12; this check runs on Python 3.11")
requires_tf_privacy = pytest.mark.skipif(not TF_PRIVACY_STACK, reason=NO_TF_PRIVACY)

# CI runs both stacks side by side on two cores within its time budget, so each
# slow end-to-end command test (a CLI run that trains models) runs on one stack,
# the library code it drives having unit tests on both, and the cases of a
# compile-heavy parametrized test are split between them (``split_stacks``).
# SPARSE_DP_ALL_STACKS=1 runs them all.
STACKS = ("tf2.15", "tf2.21")
STACK = STACKS[0] if TF_PRIVACY_STACK else STACKS[1]


def one_stack(stack: str):
  """Runs the test only on ``stack`` ("tf2.15": Python 3.10-3.11, "tf2.21": 3.12+)."""
  return pytest.mark.skipif(
      stack != STACK and os.environ.get("SPARSE_DP_ALL_STACKS") != "1",
      reason=f"run in CI on the {stack} stack only (CI time); "
             "SPARSE_DP_ALL_STACKS=1 runs it here")


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "split_stacks: the cases of this parametrized test alternate between the two "
      "stacks (case i on STACKS[i % 2]): CI runs each case once, and each stack runs the test")


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselect, so a case keeps its stack
def pytest_collection_modifyitems(items):
  """Gives each case of a ``split_stacks`` test its stack, in collection order.

  For compile-heavy tests parametrized over algorithms or settings that share
  their code on both stacks (CI time): every case runs in CI, once.
  """
  cases = {}
  for item in items:
    if item.get_closest_marker("split_stacks") is not None:
      test = (item.path, item.originalname)
      index = cases[test] = cases.get(test, -1) + 1
      item.add_marker(one_stack(STACKS[index % 2]))


# False-failure probability of every statistical test in this suite. Each test
# uses a fixed seed, so it passes or fails deterministically; this is the
# chance that a correct implementation would fail for a random seed.
ALPHA = 1e-6


@pytest.fixture
def seed():
  import tensorflow as tf
  return tf.constant([20231122, 4], tf.int64)
