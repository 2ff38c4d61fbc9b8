"""Shared test settings: quiet TensorFlow, the tiers' markers, one fixed seed per test.

``sparse_dp`` is imported before any test module imports TensorFlow or TFRS,
as the README asks: on TF 2.16+ that makes ``tf.keras`` Keras 2, which TFRS
requires (tests/integration/test_stack.py checks the other orders). The
helpers tests share are in ``tests/support/``.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

import sparse_dp  # noqa: E402,F401

from support.stacks import NO_TF_PRIVACY, STACKS, skip_elsewhere  # noqa: E402


def pytest_configure(config):
  config.addinivalue_line(
      "markers", "stack(name): run this slow test on that stack only (support.stacks.one_stack)")


@pytest.hookimpl(tryfirst=True)  # before -k/-m deselect, so a test keeps its stack
def pytest_collection_modifyitems(items):
  """Places each slow test on one stack: CI runs the fast tier on both, the slow tier once.

  A ``stack`` mark pins a test; a test that needs TF Privacy runs on its stack;
  every other ``slow`` test takes the next stack in collection order.
  """
  unpinned = 0
  for item in items:
    pinned = item.get_closest_marker("stack")
    if pinned is not None:
      stack = pinned.args[0]
    elif any(mark.kwargs.get("reason") == NO_TF_PRIVACY for mark in item.iter_markers("skipif")):
      continue
    elif item.get_closest_marker("slow") is not None:
      stack, unpinned = STACKS[unpinned % 2], unpinned + 1
    else:
      continue
    item.add_marker(skip_elsewhere(stack))


@pytest.fixture
def seed():
  import tensorflow as tf
  return tf.constant([20231122, 4], tf.int64)
