"""Under MirroredStrategy the noise is added once per step and the selection is global."""

import json
import subprocess
import sys

import numpy as np
import pytest

import support

# Subprocesses and clusters: the slow tier (conftest.py gives it one stack).
pytestmark = pytest.mark.slow

SCRIPT = support.FOLDER / "mirrored_steps.py"


@pytest.mark.parametrize("config", [
    {"algorithm": "dpsgd", "noise_multiplier": 1.0},
    # the table's noise in 4 chunks, an update over every row (mechanisms.noise.dense_noise)
    {"algorithm": "dpsgd", "noise_multiplier": 1.0, "chunk_rows": 64},
    {"algorithm": "adafest", "sigma1": 1.0, "sigma2": 1.0, "threshold": 1.5},
    {"algorithm": "adafest", "sigma1": 1.0, "sigma2": 1.0, "threshold": 1.5,
     "optimizer": "rowwise-adagrad"},
])
def test_two_replicas_equal_one_device(config):
  done = subprocess.run([sys.executable, str(SCRIPT), json.dumps(config)],
                        capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  one, two = result["one"], result["two"]
  assert one["steps"] == two["steps"] == 3
  assert one["nonzero_rows"] == two["nonzero_rows"]
  for a, b in zip(one["weights"], two["weights"]):
    # Noise added on both replicas would double its variance and break this.
    np.testing.assert_allclose(np.array(b), np.array(a), rtol=1e-4, atol=1e-5)
