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

from support.stacks import STACKS, one_stack  # noqa: E402


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


@pytest.fixture
def seed():
  import tensorflow as tf
  return tf.constant([20231122, 4], tf.int64)
