"""The tiers' placement holds: a slow test in a module one stack cannot collect is pinned.

``tests/conftest.py`` places an unpinned slow test on the stack a hash of its id
names. A module that skips itself at import on one stack (``importorskip``, a
module-level ``skip``) never reaches that hook there, so a slow test in it could
be placed on the stack that never collects it and run nowhere: such a module pins
its slow tests with ``one_stack`` (a module-level ``pytestmark``, or each test's).
"""

import ast
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]


def _skips_itself(tree: ast.Module) -> bool:
  """Whether a module calls ``pytest.importorskip`` or ``pytest.skip`` at its top level."""
  for node in tree.body:
    for call in ast.walk(node):
      if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
          and call.func.attr in ("importorskip", "skip")
          and not isinstance(node, (ast.FunctionDef, ast.ClassDef))):
        return True
  return False


def _unpinned_slow_tests(tree: ast.Module) -> list[str]:
  """The tests with a slow mark (or slow cases) and no ``one_stack`` among their decorators."""
  found = []
  for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
      decorators = " ".join(ast.unparse(d) for d in node.decorator_list)
      slow = "mark.slow" in decorators or "first_case_fast" in decorators
      if slow and "one_stack" not in decorators:
        found.append(node.name)
  return found


def _pins_its_stack(tree: ast.Module) -> bool:
  return any(isinstance(node, ast.Assign) and any(
      isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets)
             and "one_stack" in ast.unparse(node.value) for node in tree.body)


def test_a_module_that_skips_itself_on_a_stack_pins_its_slow_tests():
  unpinned = []
  for path in sorted(TESTS.rglob("test_*.py")):
    tree = ast.parse(path.read_text())
    if _skips_itself(tree) and _unpinned_slow_tests(tree) and not _pins_its_stack(tree):
      unpinned.append(str(path.relative_to(TESTS)))
  assert not unpinned, ("modules that skip themselves on a stack hold slow tests the hash may "
                        f"place there; add pytestmark = one_stack(...): {unpinned}")


def test_the_check_sees_an_unpinned_module():
  skipping = ast.parse("import pytest\nv3 = pytest.importorskip('x')\n"
                       "@pytest.mark.slow\ndef test_a():\n  pass\n")
  assert _skips_itself(skipping) and not _pins_its_stack(skipping)
  assert _unpinned_slow_tests(skipping) == ["test_a"]
  pinned = ast.parse("v3 = pytest.importorskip('x')\npytestmark = one_stack('tf2.21')\n")
  assert _pins_its_stack(pinned)
  assert not _skips_itself(ast.parse("def test_a():\n  pytest.skip('no')\n"))
