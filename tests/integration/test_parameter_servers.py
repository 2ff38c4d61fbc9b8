"""ParameterServerStrategy: sharded tables, keyed steps, accounting, replicas, retries."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import support
from support.stacks import one_stack

# A cluster the module's tests share: the slow tier, on one stack (it starts once there).
pytestmark = [pytest.mark.slow, one_stack("tf2.15")]

SCRIPT = support.FOLDER / "ps_steps.py"


def printed_json(script: pathlib.Path) -> dict:
  """The JSON line ``script`` prints last, run in a fresh process."""
  done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                        timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def printed():
  """``ps_steps.py``'s JSON: one fresh process for the module, which runs ``ps_replicas.py``'s
  replicas, then one in-process cluster (2 PS, 2 workers)."""
  return printed_json(SCRIPT)


@pytest.fixture(scope="module")
def cluster(printed):
  """The cluster's results."""
  return printed


@pytest.mark.parametrize("algorithm", ["dpsgd", "dpsgd-chunks", "adafest", "adafest-rowwise"])
def test_sharded_tables_get_the_single_process_update(cluster, algorithm):
  sharded, alone = cluster[algorithm]["cluster"], cluster[algorithm]["alone"]
  # The table is split over both parameter servers.
  assert len(sharded["devices"]) == 2
  # (which server gets which shard follows the round-robin of every variable created before)
  tasks = [next(t for t in (0, 1) if f"/job:ps/replica:0/task:{t}" in d)
           for d in sharded["devices"]]
  assert sorted(tasks) == [0, 1]
  assert sharded["keys"] == alone["keys"] == [0, 1, 2]
  assert sharded["steps"] == alone["steps"] == 3
  for mine, theirs in zip(sharded["weights"], alone["weights"]):
    # A row's update sent to the wrong shard (or dropped) would break this.
    np.testing.assert_allclose(np.array(mine), np.array(theirs), rtol=1e-4, atol=1e-5)


def test_rowwise_adagrad_keeps_one_accumulator_per_row_of_each_shard(cluster):
  # DP-AdaFEST's steps through RowwiseAdagrad: each shard accumulates its rows (not
  # rows x dimension), and the shards together hold the one-process accumulator.
  sharded, alone = cluster["adafest-rowwise"]["cluster"], cluster["adafest-rowwise"]["alone"]
  [whole] = [np.array(a) for a in alone["accumulators"]]
  shards = [np.array(a) for a in sharded["accumulators"]]
  assert len(shards) == 2 and all(shard.ndim == 1 for shard in shards)
  assert whole.shape == (len(alone["weights"][0]),)
  np.testing.assert_allclose(np.concatenate(shards), whole, rtol=1e-4, atol=1e-6)
  assert all((shard > 0.1 + 1e-6).any() for shard in shards)  # both shards' rows updated


def test_asynchronous_steps_have_distinct_noise_keys_and_are_all_counted(cluster):
  steps = cluster["async"]
  assert steps["taken"] == 8
  assert sorted(steps["keys"]) == list(range(8))  # one key per step: fresh noise, fresh batch
  assert steps["steps"] == 8  # every worker's steps, counted once each
  assert steps["epsilon"] == pytest.approx(steps["expected_epsilon"], rel=1e-9)


def test_an_attempt_lost_after_its_update_is_counted_and_rerun_with_a_fresh_key(cluster):
  lost = cluster["lost"]
  assert lost["taken"] == 4
  # The re-run drew another key (a fresh batch, fresh noise); every attempt's key is distinct.
  assert lost["lost_key"] not in lost["keys"]
  assert sorted(lost["keys"] + [lost["lost_key"]]) == list(range(5))
  # The count covers every update that landed, the lost attempt's included.
  assert lost["attempts"] == lost["counted"] == lost["updates"] == 5
  assert lost["epsilon"] == pytest.approx(lost["expected_epsilon"], rel=1e-9)


def test_keras_fit_is_refused_naming_the_fix(cluster):
  assert "ParameterServerTraining" in cluster["keras_fit"]


@pytest.fixture(scope="module")
def replicas(printed):
  """``ps_replicas.py``'s results: every algorithm on one device and on two mirrored replicas."""
  return printed["replicas"]


@pytest.mark.parametrize("algorithm", ["dpsgd", "fest", "adafest", "adafest+"])
def test_two_replicas_split_each_batch_and_equal_one_replica(replicas, algorithm):
  one, two = replicas[algorithm]["one"], replicas[algorithm]["two"]
  # Each step counted once, with its reduced logs (a float per statistic).
  assert one["counted"] == two["counted"] == 2
  assert one["logs"]["keys"] == two["logs"]["keys"] == [0, 1]
  assert two["logs"]["nonzero_rows"] == one["logs"]["nonzero_rows"]
  for a, b in zip(one["weights"], two["weights"]):
    # Every replica clipping the whole batch (an update R times the clipped sum
    # under one noise draw) or noise added on both would break this.
    np.testing.assert_allclose(np.array(b), np.array(a), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("algorithm", ["dpsgd", "adafest"])
def test_every_update_on_every_replica_waits_for_the_step_count(replicas, algorithm):
  ordered = replicas["ordered"][algorithm]
  assert ordered["writes"] == 10  # table, 2 kernels, 2 biases, on each of 2 replicas
  assert ordered["after_count"] == ordered["writes"]


def test_keys_go_on_after_a_restart_with_the_same_noise_seed(replicas):
  restarted = replicas["restarted"]
  assert restarted["first"] == [0, 1]
  assert restarted["restored"] == [2, 3]  # not [0, 1]: that noise was used already
