"""A stream state's budget: delta split like epsilon across jobs, and spent."""

import pytest

from sparse_dp.accounting.ledger import BudgetExceededError
from sparse_dp.jobs.stream.stream_state import StreamState


def _spend(state: StreamState, job: dict) -> None:
  for plan in job["periods"]:
    if plan["selection_epsilon"] > 0:
      state.ledger.record(plan["period"], "selection", plan["selection_epsilon"], 0.0)
    state.ledger.record(plan["period"], "training", plan["training_epsilon"], plan["delta"])
  state.finish(job)


def test_delta_is_split_like_epsilon_so_later_jobs_can_spend(tmp_path):
  state = StreamState.open(tmp_path, 1.0, 1e-5)
  small = state.start_job({}, [[1], [2]], [False, False], 0.1, epsilon_per_period=0.1)
  # 0.1 of epsilon 1 a period: 0.1 of delta 1e-5 a period, not half of all of it.
  assert [p["delta"] for p in small["periods"]] == pytest.approx([1e-6, 1e-6])
  _spend(state, small)
  rest = state.start_job({}, [[3], [4]], [True, False], 0.25, epsilon_per_period=None)
  assert [p["selection_epsilon"] + p["training_epsilon"] for p in rest["periods"]] == \
      pytest.approx([0.4, 0.4])
  assert [p["delta"] for p in rest["periods"]] == pytest.approx([4e-6, 4e-6])
  _spend(state, rest)
  assert state.ledger.epsilon_spent == pytest.approx(1)
  assert state.ledger.delta_spent == pytest.approx(1e-5)
  with pytest.raises(BudgetExceededError, match="only 0 of the total epsilon 1 remains"):
    state.start_job({}, [[5]], [False], 0.1, epsilon_per_period=0.1)


def test_a_state_whose_delta_is_spent_refuses_a_job_naming_delta(tmp_path):
  state = StreamState.open(tmp_path, 1.0, 1e-5)
  state.ledger.record(1, "training", 0.1, 1e-5)  # as an earlier rule let a first job do
  with pytest.raises(BudgetExceededError, match="need a positive delta, but none of the total "
                                                "delta 1e-05 remains"):
    state.start_job({}, [[2]], [False], 0.1, epsilon_per_period=0.1)
  with pytest.raises(BudgetExceededError, match="needs epsilon 1.2"):
    StreamState.open(tmp_path / "new", 1.0, 1e-5).start_job({}, [[1], [2]], [False, False],
                                                           0.1, epsilon_per_period=0.6)
