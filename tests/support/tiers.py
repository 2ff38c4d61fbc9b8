"""Parametrized cases split between the tiers: the first in the fast tier, the rest slow."""

import pytest


def first_case_fast(cases, ids=None, fast=1):
  """``cases`` for ``pytest.mark.parametrize``, each after the first ``fast`` marked ``slow``.

  The fast tier (both stacks) runs one case of the test; the slow tier runs the
  others once, each on one stack (tests/conftest.py).

  Args:
    cases: the parameter values or tuples, in order.
    ids: their test ids, as ``parametrize`` takes them (None: pytest's own).
    fast: how many cases, from the first, stay in the fast tier.

  Returns:
    The cases as ``pytest.param`` objects.
  """
  ids = list(ids) if ids is not None else [None] * len(cases)
  return [pytest.param(*(case if isinstance(case, tuple) else (case,)), id=name,
                       marks=() if index < fast else pytest.mark.slow)
          for index, (case, name) in enumerate(zip(cases, ids))]
