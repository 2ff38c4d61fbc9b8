"""Under MirroredStrategy the noise is added once per step and the selection is global."""

import json
import subprocess
import sys

import numpy as np
import pytest

import support

# Subprocesses and clusters: the slow tier (conftest.py gives each case one stack).
pytestmark = pytest.mark.slow

SCRIPT = support.FOLDER / "mirrored_steps.py"

CONFIGS = [
    {"algorithm": "dpsgd", "noise_multiplier": 1.0},
    # the table's noise in 4 chunks, an update over every row (mechanisms.noise.dense_noise)
    {"algorithm": "dpsgd", "noise_multiplier": 1.0, "chunk_rows": 64},
    {"algorithm": "adafest", "sigma1": 1.0, "sigma2": 1.0, "threshold": 1.5},
    {"algorithm": "adafest", "sigma1": 1.0, "sigma2": 1.0, "threshold": 1.5,
     "optimizer": "rowwise-adagrad"},
]


@pytest.fixture(scope="module")
def trained(request):
  """``mirrored_steps.py``'s JSON, by index in ``CONFIGS``: each configuration this run's cases
  check (selected, not skipped on this stack) on one device and on two replicas, all in one
  fresh process (TensorFlow started once, not once a configuration)."""
  wanted = sorted({CONFIGS.index(item.callspec.params["config"])
                   for item in request.session.items if item.module is request.module
                   and not any((mark.args or (mark.kwargs.get("condition"),))[0] is True
                           for mark in item.iter_markers("skipif"))})
  done = subprocess.run([sys.executable, str(SCRIPT), json.dumps([CONFIGS[i] for i in wanted])],
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return dict(zip(wanted, json.loads(done.stdout.strip().splitlines()[-1])))


@pytest.mark.parametrize("config", CONFIGS)
def test_two_replicas_equal_one_device(trained, config):
  one, two = trained[CONFIGS.index(config)]["one"], trained[CONFIGS.index(config)]["two"]
  assert one["steps"] == two["steps"] == 3
  assert one["nonzero_rows"] == two["nonzero_rows"]
  for a, b in zip(one["weights"], two["weights"]):
    # Noise added on both replicas would double its variance and break this.
    np.testing.assert_allclose(np.array(b), np.array(a), rtol=1e-4, atol=1e-5)
