"""One job at a time on a stream state, through ``sparse-dp stream``."""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from sparse_dp.cli import main
from sparse_dp.jobs.stream.stream_lock import LOCK_FILE, StateLock

from support.stacks import one_stack

# One day of 200 examples, a DP-SGD period on 1% tables and 8 hidden units.
TINY = ["--categorical-features", "2", "--train-days", "1", "--eval-days", "2",
        "--examples-per-day", "200",
        "--eval-examples-per-day", "100", "--synthetic-scale", "0.01", "--hidden-units", "8",
        "--batch-size", "64", "--algorithm", "dpsgd", "--total-epsilon", "1"]

_HOLDER = """
import sys
from sparse_dp.jobs.stream.stream_lock import StateLock
with StateLock(sys.argv[1]):
  print("locked", flush=True)
  sys.stdin.read()
"""


def ledger_epsilons(state):
  lines = (state / "ledger.jsonl").read_text().splitlines()
  return [json.loads(line)["epsilon"] for line in lines]


@pytest.mark.slow
def test_a_job_on_a_locked_state_exits_2_naming_the_holder_until_the_holder_is_killed(
    tmp_path, capsys):
  state = tmp_path / "state"
  # Run outside the checkout, so that it imports the installed sparse_dp.models.
  holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(state)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=tmp_path)
  assert holder.stdout.readline() == "locked\n"
  assert main(["stream", *TINY, "--state", str(state)]) == 2
  error = capsys.readouterr().err
  assert f"is in use by another stream job (pid {holder.pid} on host {socket.gethostname()}, " \
         "started " in error and f"-c {state}" in error and "--wait-for-lock" in error
  assert main(["stream", *TINY, "--state", str(state), "--wait-for-lock", "0.2"]) == 2
  assert "after waiting 0.2 s" in capsys.readouterr().err
  assert not (state / "ledger.jsonl").exists() and not (state / "stream.json").exists()
  # Killed, the holder leaves its record in the lock file but not its lock.
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  assert json.loads((state / LOCK_FILE).read_text())["pid"] == holder.pid
  # Now a job takes the lock: it plans under it, and this plan (2 > 1) is refused there,
  # before any training (test_two_jobs_... and test_stream_job.py run jobs to the end).
  assert main(["stream", *TINY, "--epsilon-per-period", "2", "--state", str(state)]) == 2
  assert "needs epsilon 2" in capsys.readouterr().err
  assert (state / LOCK_FILE).read_text() == ""  # an ended job leaves no holder named
  with pytest.raises(ValueError, match="--wait-for-lock must be >= 0"):
    StateLock(state, wait_seconds=-1)


@pytest.mark.slow
@one_stack("tf2.21")  # an end-to-end run; its library code has unit tests on both stacks
def test_two_jobs_started_at_once_spend_the_budget_once(tmp_path):
  state = tmp_path / "state"
  command = [sys.executable, "-m", "sparse_dp.cli", "stream", *TINY, "--state", str(state),
             "--wait-for-lock", "600", "--json"]
  environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
  jobs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=tmp_path, env=environment) for _ in range(2)]
  outputs = [job.communicate(timeout=600) for job in jobs]
  results = sorted((job.returncode, *output) for job, output in zip(jobs, outputs))
  (first, first_out, _), (second, _, second_error) = results
  # The lock lets one spend the budget; the other waits, re-reads the ledger and is refused.
  assert (first, second) == (0, 2)
  assert json.loads(first_out)["epsilon_spent"] == pytest.approx(1)
  assert "only 0 of the total epsilon 1 remains" in second_error
  assert sum(ledger_epsilons(state)) <= 1 + 1e-9 and len(ledger_epsilons(state)) == 1
