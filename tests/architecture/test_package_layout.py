"""The package's import graph has no cycle and never imports up a layer.

The graph is read from the source (``ast``), not by importing: every ``import``
and ``from ... import`` of every module counts, at the top, inside functions and
under ``if TYPE_CHECKING:`` alike, since each is a dependency a reader follows.
``models/`` and ``data/`` are read as ``sparse_dp.models`` and ``sparse_dp.data``,
the names ``setup.py`` installs them under.

An edge ``a -> b`` is drawn to the module ``b`` names: ``from p import m`` to
``p.m`` when ``m`` is a module, else to ``p`` (its ``__init__``). Importing
``p.q.m`` runs ``p/__init__.py`` and ``p/q/__init__.py`` first, so edges go to
those packages too, except the ones ``a`` lies in (they are already running).
"""

from __future__ import annotations

import ast
import pathlib
from typing import Optional

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Where each installed package's source lies (setup.py's ``package_dir``).
SOURCES = {"sparse_dp": "sparse_dp", "sparse_dp.models": "models", "sparse_dp.data": "data"}

# The layers, lowest first. A module may import from its own layer and the ones
# below, never from one above. A name covers that module and everything under
# it, and the longest name that covers a module decides its layer; ``sparse_dp``
# itself covers only the package's ``__init__`` (a facade whose own imports are
# lazy: it loads ``sparse_dp.training`` by name when ``make_private`` is used).
LAYERS: tuple[tuple[str, ...], ...] = (
    # No TensorFlow: the facade, the accountant, the data readers.
    ("sparse_dp", "sparse_dp._tensorflow_import", "sparse_dp.accounting", "sparse_dp.data",
     "sparse_dp.embedding_tables"),
    ("sparse_dp._keras",),
    # TensorFlow building blocks: the mechanisms' draws and row ids first.
    ("sparse_dp.mechanisms.randomness", "sparse_dp.mechanisms.rows"),
    ("sparse_dp.distribute", "sparse_dp.mechanisms", "sparse_dp.optimizers",
     "sparse_dp.preprocessing"),
    ("sparse_dp.layers",),
    # Training, bottom up: what a run keeps and how it samples, the DP step, the
    # checks that refuse a model, make_private and the Keras wrappers, the TPU
    # loop and the public names.
    ("sparse_dp.training.config", "sparse_dp.training.dp_state", "sparse_dp.training.poisson"),
    ("sparse_dp.training.dp_step",),
    ("sparse_dp.training.checks",),
    ("sparse_dp.training.wrappers",),
    ("sparse_dp.training",),
    # The pCTR model definitions and their data; then the jobs, apart from the
    # library: where their progress goes, the Beam sampling job, the train job
    # (which reads sampled batches), the stream job that retrains it, and a
    # study's parts below its studies.
    ("sparse_dp.models",),
    ("sparse_dp.jobs", "sparse_dp.jobs.job_output"),
    ("sparse_dp.jobs.sample",),
    ("sparse_dp.jobs.train",),
    ("sparse_dp.jobs.stream",),
    ("sparse_dp.jobs.study.presets", "sparse_dp.jobs.study.reports", "sparse_dp.jobs.study.runner"),
    ("sparse_dp.jobs.bench", "sparse_dp.jobs.distill", "sparse_dp.jobs.study"),
    ("sparse_dp.jobs.audit",),
    ("sparse_dp.__main__", "sparse_dp.cli"),
)


def module_files(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
  """Every module's dotted name and its file."""
  files = {}
  for package, folder in SOURCES.items():
    for path in sorted((root / folder).rglob("*.py")):
      parts = path.relative_to(root / folder).with_suffix("").parts
      files[".".join((package,) + parts[:-1 if parts[-1] == "__init__" else None])] = path
  return files


def import_graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
  """``{module: the package's modules it imports}``."""
  files = module_files(root)
  graph = {}
  for name, path in files.items():
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      if isinstance(node, ast.Import):
        targets.update(alias.name for alias in node.names)
      elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
          parent = package.split(".")[:len(package.split(".")) - node.level + 1]
          base = ".".join(parent + [base] if base else parent)
        targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base
                       for alias in node.names)
    modules = {_enclosing_module(target, files) for target in targets} - {None}
    graph[name] = {package for module in modules for package in _packages_run(module, files)
                   if package not in _packages_run(name, files)}
  return graph


def _packages_run(module: str, files) -> set[str]:
  """``module`` and the packages whose ``__init__`` its import runs (``p.q.m``: ``p``, ``p.q``)."""
  parts = module.split(".")
  return {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & set(files)


def _enclosing_module(target: str, files) -> Optional[str]:
  """The package's module ``target`` names (``p.m.f`` -> ``p.m``); None outside the package."""
  while target and target not in files:
    target = target.rpartition(".")[0]
  return target or None


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
  """The strongly connected components of more than one module (Tarjan's algorithm)."""
  index, low, on_stack, stack, found = {}, {}, set(), [], []

  def visit(module):
    index[module] = low[module] = len(index)
    stack.append(module)
    on_stack.add(module)
    for imported in sorted(graph[module]):
      if imported not in index:
        visit(imported)
        low[module] = min(low[module], low[imported])
      elif imported in on_stack:
        low[module] = min(low[module], index[imported])
    if low[module] == index[module]:
      component = set()
      while module not in component:
        member = stack.pop()
        on_stack.discard(member)
        component.add(member)
      if len(component) > 1:
        found.append(frozenset(component))

  for module in sorted(graph):
    if module not in index:
      visit(module)
  return found


def layer_of(module: str) -> Optional[int]:
  """The index in :data:`LAYERS` of the longest name covering ``module``; None if none does."""
  covering = [(len(name), level) for level, names in enumerate(LAYERS) for name in names
              if module == name or (name != "sparse_dp" and module.startswith(name + "."))]
  return max(covering)[1] if covering else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
  return [f"{module} (layer {layer_of(module)}) imports {imported} (layer {layer_of(imported)})"
          for module, imports in sorted(graph.items()) for imported in sorted(imports)
          if layer_of(imported) > layer_of(module)]


def test_no_import_cycle():
  found = [sorted(cycle) for cycle in cycles(import_graph())]
  assert not found, f"import cycles: {found}"


def test_every_module_has_a_layer():
  unplaced = [module for module in import_graph() if layer_of(module) is None]
  assert not unplaced, f"add these modules to a layer of LAYERS: {unplaced}"


def test_no_import_goes_up_a_layer():
  upward = upward_imports(import_graph())
  assert not upward, "imports up the layers of LAYERS:\n" + "\n".join(upward)


def test_graph_counts_every_import(tmp_path):
  """The checks see imports inside functions, relative ones and type-only ones."""
  package = tmp_path / "sparse_dp"
  (package / "inner").mkdir(parents=True)
  (package / "__init__.py").write_text("")
  (package / "inner" / "__init__.py").write_text("")
  (package / "inner" / "low.py").write_text("def f():\n  from sparse_dp.inner import high\n")
  (package / "inner" / "high.py").write_text(
      "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n  from .low import f\n")
  (package / "other").mkdir()
  (package / "other" / "__init__.py").write_text("from sparse_dp.other import sub\n")
  (package / "other" / "sub.py").write_text("")
  (package / "user.py").write_text("import sparse_dp.other.sub\n")
  graph = import_graph(tmp_path)
  assert graph["sparse_dp.inner.low"] == {"sparse_dp.inner.high"}
  assert graph["sparse_dp.inner.high"] == {"sparse_dp.inner.low"}
  assert cycles(graph) == [frozenset({"sparse_dp.inner.low", "sparse_dp.inner.high"})]
  # Importing a submodule runs its package's __init__ (not the importer's own package's).
  assert graph["sparse_dp.user"] == {"sparse_dp.other", "sparse_dp.other.sub"}
  assert graph["sparse_dp.other"] == {"sparse_dp.other.sub"}


def test_one_name_per_module():
  """No two modules share a file name: a name says which one it is without its folder."""
  by_name = {}
  for name, path in module_files().items():
    if path.name not in ("__init__.py", "__main__.py"):
      by_name.setdefault(path.stem, []).append(name)
  shared = {stem: names for stem, names in by_name.items() if len(names) > 1}
  assert not shared, f"modules that share a name (rename one): {shared}"


# What loads TensorFlow (or a Keras on top of it) when imported.
TENSORFLOW = ("tensorflow", "keras", "tf_keras", "tensorflow_recommenders")


def _top_level_imports(path: pathlib.Path) -> set[str]:
  """The names a module imports when it is imported: its body's imports (inside ``if`` and
  ``try`` too), not those inside functions or classes, which run later if at all."""
  names, pending = set(), list(ast.parse(path.read_text(), str(path)).body)
  while pending:
    node = pending.pop()
    if isinstance(node, ast.Import):
      names.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and not node.level:
      names.update([node.module] + [f"{node.module}.{alias.name}" for alias in node.names])
    elif isinstance(node, (ast.If, ast.Try)):
      pending.extend(ast.iter_child_nodes(node))
    elif isinstance(node, ast.ExceptHandler):
      pending.extend(node.body)
  return names


def loaded_on_import(module: str) -> set[str]:
  """The package's modules that importing ``module`` runs, through top-level imports."""
  files, loaded, pending = module_files(), set(), [module]
  while pending:
    name = pending.pop()
    for ran in _packages_run(name, files) - loaded:
      loaded.add(ran)
      pending.extend(filter(None, (_enclosing_module(target, files)
                                   for target in _top_level_imports(files[ran]))))
  return loaded


def tensorflow_importers(modules) -> dict[str, list[str]]:
  """Those of ``modules`` that import TensorFlow or a Keras at their top, with what."""
  files = module_files()
  found = {name: sorted(target for target in _top_level_imports(files[name])
                        if target.split(".")[0] in TENSORFLOW) for name in modules}
  return {name: targets for name, targets in found.items() if targets}


def test_the_privacy_calculator_loads_no_tensorflow():
  """``sparse-dp privacy`` (and every accountant module) starts in a second: no module it
  runs on import imports TensorFlow or Keras at its top."""
  modules = loaded_on_import("sparse_dp.cli.privacy_command") | {
      name for name in module_files() if name.startswith("sparse_dp.accounting")}
  assert "sparse_dp.accounting.adafest_defaults" in modules
  assert not tensorflow_importers(modules)
  # The check sees it where it is: the training package's config runs its __init__.
  assert tensorflow_importers(loaded_on_import("sparse_dp.training.config"))
