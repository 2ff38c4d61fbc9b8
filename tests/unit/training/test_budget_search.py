"""The step limit of an epsilon budget: the largest step count within it, found in few
epsilon evaluations (``sparse_dp.training.wrappers.private_training.largest_within``)."""

from __future__ import annotations

import numpy as np
import pytest

import sparse_dp
from sparse_dp.training.wrappers.private_training import largest_within

from support.keras_models import one_table_model


@pytest.mark.parametrize("seed", range(3))
def test_the_search_finds_the_last_count_within_the_bound_of_any_increasing_function(seed):
  rng = np.random.default_rng(seed)
  for _ in range(300):
    answer = int(rng.integers(0, 5000))
    low = int(rng.integers(0, answer + 1))
    guess = low + int(rng.integers(1, 8000))
    shape = rng.choice(["power", "steps", "jump"])
    if shape == "power":  # as epsilon grows: about a power of the steps
      exponent, scale = rng.uniform(0.2, 1.2), rng.uniform(0.01, 2.0)
      value = lambda n, e=exponent, s=scale: s * n ** e  # noqa: E731
      bound = value(answer + 0.5)
    elif shape == "steps":  # a PLD's discretisation: flat runs
      value = lambda n: float(n // 7) + (1000.0 if n > answer else 0.0)  # noqa: E731
      bound = answer // 7 + 0.5
    else:  # flat, then a cliff
      value = lambda n: 0.0 if n <= answer else 1.0  # noqa: E731
      bound = 0.5
    assert largest_within(value, bound, low, guess) == answer


def test_a_power_law_is_settled_in_a_handful_of_evaluations():
  for answer in (50, 176, 2000, 100_000):
    calls = []
    scale = 1.0 / (answer + 0.5) ** 0.6
    found = largest_within(lambda n: calls.append(n) or scale * n ** 0.6, 1.0, 0, 1)
    assert found == answer
    assert len(calls) <= 7, calls


@pytest.mark.parametrize("budget", [0.4, 1.0])
def test_the_step_limit_is_the_last_step_count_within_the_budget(budget):
  model = one_table_model(20)
  config = sparse_dp.DPConfig("dpsgd", noise_multiplier=0.9, epsilon_budget=budget, noise_seed=2)
  private = sparse_dp.make_private(model, config, num_examples=256, batch_size=16)
  limit = private.max_steps_within_budget()
  assert limit > 0
  assert private.epsilon(limit) <= budget < private.epsilon(limit + 1)
