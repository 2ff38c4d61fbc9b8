"""Shared test settings: quiet TensorFlow, the tiers' markers, one fixed seed per test.

``sparse_dp`` is imported before any test module imports TensorFlow or TFRS,
as the README asks: on TF 2.16+ that makes ``tf.keras`` Keras 2, which TFRS
requires (tests/integration/test_stack.py checks the other orders). The
helpers tests share are in ``tests/support/``.
"""

import os
import tempfile
import zlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Keys of the jobs' keyed training-example records: never the user's ~/.sparse_dp/keys.
os.environ.setdefault("SPARSE_DP_SECRETS_DIR", tempfile.mkdtemp(prefix="sparse-dp-test-keys-"))
# Synthetic days drawn once per test session and reused by the jobs that draw the same days:
# never the user's ~/.cache/sparse_dp.
os.environ.setdefault("SPARSE_DP_CACHE_DIR", tempfile.mkdtemp(prefix="sparse-dp-test-cache-"))

import pytest  # noqa: E402

import sparse_dp  # noqa: E402,F401

from support.stacks import STACKS, skip_elsewhere  # noqa: E402


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "stack(name): run this slow test on that stack only (support.stacks.one_stack)")


def stack_of(nodeid: str) -> str:
  """The stack a slow test runs on: a hash of its id, the same whatever a stack collects."""
  return STACKS[zlib.crc32(nodeid.encode()) % 2]


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselect, so a test keeps its stack
def pytest_collection_modifyitems(items):
  """Places each slow test on one stack: CI runs the fast tier on both, the slow tier once.

  A ``stack`` mark pins a test; a slow test with a ``skipif`` of its own (TF Privacy,
  Keras 3) already runs where it can; every other slow test runs on :func:`stack_of`.
  """
  for item in items:
    pinned = item.get_closest_marker("stack")
    if pinned is not None:
      stack = pinned.args[0]
    elif item.get_closest_marker("slow") is None or any(item.iter_markers("skipif")):
      continue
    else:
      stack = stack_of(item.nodeid)
    item.add_marker(skip_elsewhere(stack))


@pytest.fixture
def seed():
  import tensorflow as tf
  return tf.constant([20231122, 4], tf.int64)
