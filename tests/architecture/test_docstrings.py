"""Docstrings hold: short module docstrings, Google-style sections on every public name.

A module docstring under sparse_dp/, models/, data/ or benchmarks/ is at most 15
lines: what the module holds, its formula, the paper and a link into docs/; the
explanation is the manual's. Every function and class a ``__all__`` of sparse_dp
names, and every public method such a class defines itself, has a docstring of its
own (mkdocstrings renders it and inherits none): ``Args:`` when it takes parameters
besides ``self``/``cls``, ``Returns:`` (or ``Yields:``) when its body returns a
value, properties exempt. The sections are read from the source (``ast``); the
modules are imported only to resolve the names of their ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pathlib
import textwrap
from typing import Iterator, List, Optional

import sparse_dp

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULE_FOLDERS = ("sparse_dp", "models", "data", "benchmarks")
# The package as imported (installed, or this checkout): its ``__all__`` names are resolved there.
PACKAGE = pathlib.Path(sparse_dp.__file__).resolve().parent
MAX_MODULE_DOCSTRING_LINES = 15
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def module_docstring_lines(source: str) -> int:
  """The lines of a module's docstring (0 without one), as ``inspect.cleandoc`` leaves them."""
  docstring = ast.get_docstring(ast.parse(source))
  return len(docstring.splitlines()) if docstring else 0


def _returns_a_value(function: ast.AST) -> bool:
  """Whether ``function``'s own body (not a nested function's or class's) returns a value."""
  nodes = list(function.body)
  while nodes:
    node = nodes.pop()
    if isinstance(node, ast.Return) and node.value is not None:
      return True
    if not isinstance(node, (*FUNCTIONS, ast.Lambda, ast.ClassDef)):
      nodes.extend(ast.iter_child_nodes(node))
  return False


def _decorators(node: ast.AST) -> set:
  return {ast.unparse(d).split("(")[0].rsplit(".", 1)[-1] for d in node.decorator_list}


def function_arguments(node: ast.AST) -> List[str]:
  """A function's parameters, ``self`` or ``cls`` included, ``*args`` and ``**kwargs`` last."""
  arguments = node.args
  named = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs)]
  return named + [a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None]


def _label(name: str, node: ast.AST, where: Optional[tuple]) -> str:
  """``name``, and ``(path:line)`` of its definition when ``where`` (path, first line) says."""
  return f"{name} ({where[0]}:{where[1] + node.lineno - 1})" if where else name


def function_gaps(node: ast.AST, name: str, method: bool = False,
                  where: Optional[tuple] = None) -> List[str]:
  """What a function's (or method's) docstring lacks, each with its fix."""
  name = _label(name, node, where)
  docstring = ast.get_docstring(node)
  if not docstring:
    return [f"{name}: no docstring; add one (a summary line, then Args:/Returns: as needed)"]
  decorators = _decorators(node)
  if "property" in decorators or "cached_property" in decorators:
    return []
  parameters = function_arguments(node)
  if method and "staticmethod" not in decorators:
    parameters = parameters[1:]  # self or cls
  gaps = []
  if parameters and "Args:" not in docstring:
    gaps.append(f"{name}: no Args: section; add 'Args:' with a line for each of "
                f"{', '.join(parameters)}")
  if _returns_a_value(node) and "Returns:" not in docstring and "Yields:" not in docstring:
    gaps.append(f"{name}: returns a value but has no Returns: section; add 'Returns:' "
                "saying what it returns")
  return gaps


def class_gaps(node: ast.ClassDef, name: str, where: Optional[tuple] = None) -> List[str]:
  """What a class's docstring, and those of the public methods it defines, lack."""
  label = _label(name, node, where)
  docstring = ast.get_docstring(node)
  if not docstring:
    return [f"{label}: no docstring; add one (a summary line, then Args: or Attributes:)"]
  gaps = []
  init = [m for m in node.body if isinstance(m, FUNCTIONS) and m.name == "__init__"]
  fields = [m.target.id for m in node.body
            if isinstance(m, ast.AnnAssign) and isinstance(m.target, ast.Name)]
  arguments = function_arguments(init[0])[1:] if init else fields  # a dataclass's fields
  if arguments and "Args:" not in docstring and "Attributes:" not in docstring:
    gaps.append(f"{label}: no Args: (or Attributes:) section; add one with a line for each of "
                f"{', '.join(arguments)}")
  for member in node.body:
    if isinstance(member, FUNCTIONS) and not member.name.startswith("_"):
      gaps += function_gaps(member, f"{name}.{member.name}", method=True, where=where)
  return gaps


def _modules_with_all() -> Iterator[str]:
  """The sparse_dp modules whose top level assigns ``__all__``, found without importing."""
  for path in sorted(PACKAGE.rglob("*.py")):
    tree = ast.parse(path.read_text())
    if any(isinstance(node, ast.Assign) and any(
        isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets)
           for node in tree.body):
      parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
      yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _definition(obj) -> tuple:
  """The syntax tree of ``obj``'s definition, and where it is: (path, first line)."""
  lines, first = inspect.getsourcelines(obj)
  path = pathlib.Path(inspect.getsourcefile(obj)).resolve()
  return (ast.parse(textwrap.dedent("".join(lines))).body[0],
          (path.relative_to(PACKAGE.parent), first))


def public_api_gaps() -> List[str]:
  """The gaps of every function and class named in a ``__all__`` of sparse_dp (once each)."""
  gaps, seen = [], set()
  for module_name in _modules_with_all():
    module = importlib.import_module(module_name)
    for name in module.__all__:
      obj = getattr(module, name)
      if (id(obj) in seen or not (inspect.isclass(obj) or inspect.isfunction(obj))
          or not obj.__module__.startswith("sparse_dp")):
        continue  # constants and type aliases carry no sections; TensorFlow's names its own
      seen.add(id(obj))
      node, where = _definition(obj)
      check = class_gaps if inspect.isclass(obj) else function_gaps
      gaps += check(node, f"{module_name}.{name}", where=where)
  return gaps


def test_module_docstrings_are_short():
  long = []
  for folder in MODULE_FOLDERS:
    for path in sorted((ROOT / folder).rglob("*.py")):
      lines = module_docstring_lines(path.read_text())
      if lines > MAX_MODULE_DOCSTRING_LINES:
        long.append(f"{path.relative_to(ROOT)}: {lines} lines")
  assert not long, (
      f"module docstrings over {MAX_MODULE_DOCSTRING_LINES} lines: {long}; keep what the "
      "module holds, its formula, the paper and a link into docs/ (\"See docs/<page>.md\"), "
      "and move the explanation into that page")


def test_public_names_have_google_style_sections():
  gaps = public_api_gaps()
  assert not gaps, ("public names of sparse_dp whose docstrings lack Google-style sections "
                    "(mkdocstrings renders them):\n" + "\n".join(gaps))


def test_the_checks_see_a_violation():
  source = textwrap.dedent('''\
      """One.

      Two.
      """


      def documented(x):
        """Doubles.

        Args:
          x: a number.

        Returns:
          ``2 x``.
        """
        return 2 * x


      def no_sections(x):
        """Doubles."""
        def inner():
          return 1
        return 2 * x


      def returns_nothing():
        """Prints."""
        def inner():
          return 1
        print(inner())


      class Table:
        """A table."""

        @property
        def rows(self):
          """The rows."""
          return 1

        def lookup(self, ids):
          return ids

        @staticmethod
        def make(size):
          """Makes one.

          Args:
            size: rows.
          """
          return Table()

        def _private(self, x):
          return x


      class Bare:
        pass


      class Point:
        """A point."""
        x: float
      ''')
  assert module_docstring_lines(source) == 3
  assert module_docstring_lines("x = 1\n") == 0
  essay = '"""' + "\n".join(["A line."] * 16) + '\n"""\n'
  assert module_docstring_lines(essay) == 16 > MAX_MODULE_DOCSTRING_LINES
  assert module_docstring_lines('"""' + "\n" * 20 + 'x"""\n') == 1  # blank lines trimmed
  nodes = {node.name: node for node in ast.parse(source).body if hasattr(node, "name")}
  assert function_gaps(nodes["documented"], "documented") == []
  assert [gap.split(":")[1].strip() for gap in function_gaps(nodes["no_sections"], "f")] == [
      "no Args", "returns a value but has no Returns"]
  assert function_gaps(nodes["returns_nothing"], "g") == []  # inner's return is not its own
  # The property and the private method are exempt; the static method has no self to drop.
  assert [gap.split(";")[0] for gap in class_gaps(nodes["Table"], "Table")] == [
      "Table.lookup: no docstring", "Table.make: returns a value but has no Returns: section"]
  assert class_gaps(nodes["Bare"], "Bare")[0].startswith("Bare: no docstring")
  assert class_gaps(nodes["Point"], "Point")[0].startswith("Point: no Args: (or Attributes:)")
