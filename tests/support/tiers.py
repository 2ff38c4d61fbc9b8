"""Parametrized cases split between the tiers: the first in the fast tier, the rest slow."""

import pytest


def first_case_fast(cases, ids=None):
  """``cases`` for ``pytest.mark.parametrize``, each after the first marked ``slow``.

  The fast tier (both stacks) runs one case of the test; the slow tier runs the
  others once, each on one stack (tests/conftest.py).

  Args:
    cases: the parameter values or tuples, in order.
    ids: their test ids, as ``parametrize`` takes them (None: pytest's own).

  Returns:
    The cases as ``pytest.param`` objects.
  """
  ids = list(ids) if ids is not None else [None] * len(cases)
  return [pytest.param(*(case if isinstance(case, tuple) else (case,)), id=name,
                       marks=() if index == 0 else pytest.mark.slow)
          for index, (case, name) in enumerate(zip(cases, ids))]
