"""Two worker processes under MultiWorkerMirroredStrategy equal one process."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import support
from support.ports import free_ports
from support.stacks import one_stack

# A cluster the module's tests share: the slow tier, on one stack (it starts once there).
pytestmark = [pytest.mark.slow, one_stack("tf2.21")]

SCRIPT = support.FOLDER / "multiworker_steps.py"


@pytest.fixture(scope="module")
def workers():
  """Both workers' JSON results: the cluster is launched once for the module."""
  addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
  processes = []
  for index in range(2):
    config = {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}
    env = dict(os.environ, TF_CONFIG=json.dumps(config), TF_CPP_MIN_LOG_LEVEL="2")
    processes.append(subprocess.Popen([sys.executable, str(SCRIPT)], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
  results = []
  try:
    for process in processes:
      out, err = process.communicate(timeout=300)
      assert process.returncode == 0, err[-3000:]
      results.append(json.loads(out.strip().splitlines()[-1]))
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
  return results


@pytest.mark.parametrize("run", ["dpsgd", "adafest"])
def test_two_workers_equal_one_process(workers, run):
  chief, other = workers[0][run], workers[1][run]
  # The process alone: worker 0's (DP-SGD) or worker 1's (DP-AdaFEST), once the cluster's done.
  cluster, [alone] = chief["cluster"], [w[run]["alone"] for w in workers if "alone" in w[run]]
  # Each worker drew its own OS seed; make_private must share worker 0's. Each set
  # its own TF global seed too, which the Poisson batches must not depend on.
  assert other["cluster"]["seed"] == cluster["seed"] == alone["seed"]
  # The global steps are counted once: 3 on every worker, as alone.
  assert cluster["steps"] == other["cluster"]["steps"] == alone["steps"] == 3
  assert cluster["poisson"] and alone["poisson"]
  assert cluster["nonzero_rows"] == alone["nonzero_rows"]
  for mine, theirs, single in zip(cluster["weights"], other["cluster"]["weights"],
                                  alone["weights"]):
    np.testing.assert_array_equal(np.array(mine), np.array(theirs))
    # Noise added on both workers, or selections from two seeds, would break this.
    np.testing.assert_allclose(np.array(mine), np.array(single), rtol=1e-4, atol=1e-5)


def test_workers_about_to_draw_different_poisson_batches_are_refused_before_a_step(workers):
  # Worker 1 made one Poisson dataset more: its fit's dataset has another stream.
  for worker in workers:
    assert "different Poisson batches" in worker["extra_dataset"]["refused"]
    assert worker["extra_dataset"]["steps"] == 0


def test_poisson_batches_that_fit_would_not_slice_exactly_are_refused_before_a_step(workers):
  # AutoShardPolicy.OFF: every worker would train the same slices of each batch.
  for worker in workers:
    assert "AutoShardPolicy.OFF" in worker["unsliced"]["refused"]
    assert worker["unsliced"]["steps"] == 0
