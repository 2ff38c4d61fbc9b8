"""Shared test settings: quiet TensorFlow, one fixed seed per test."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

# False-failure probability of every statistical test in this suite. Each test
# uses a fixed seed, so it passes or fails deterministically; this is the
# chance that a correct implementation would fail for a random seed.
ALPHA = 1e-6


@pytest.fixture
def seed():
  import tensorflow as tf
  return tf.constant([20231122, 4], tf.int64)
