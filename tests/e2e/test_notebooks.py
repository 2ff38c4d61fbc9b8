"""The notebooks run top to bottom at the smoke preset in a fresh kernel of this
interpreter; their figures match their JSON; the committed ones are paired with their
jupytext sources and carry the full run's outputs (the trade-off notebook: the paper
preset's, drawn from its committed cache), each closing on whether the paper's claims
hold."""

import pathlib

import pytest

jupytext = pytest.importorskip("jupytext", reason="test extra: pip install '.[test]'")

from sparse_dp.jobs.study.notebooks import execute  # noqa: E402
from sparse_dp.jobs.study.studies import output_paths  # noqa: E402

from support.stacks import one_stack  # noqa: E402
from support.study_checks import assert_figure_matches_report  # noqa: E402

# The repository's notebooks (the installed package does not hold them).
NOTEBOOKS = pathlib.Path(__file__).resolve().parents[2] / "notebooks"
# Executed in this order into one folder: later notebooks reuse the runs cached by
# earlier ones (the throughput's first scale is the sweeps' data).
STUDIES = {"01_quickstart": [], "02_criteo_tradeoffs": ["tradeoffs", "epsilon", "heatmap"],
           "03_streaming": ["streaming"], "04_step_time": ["step-time"]}


# The words a claim's line ends with (sparse_dp.jobs.study.reports.claims).
VERDICTS = ("holds", "does not hold", "undecided")


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> pathlib.Path:
  return tmp_path_factory.mktemp("notebooks")


def test_every_notebook_is_listed():
  assert sorted(p.stem for p in NOTEBOOKS.glob("[0-9]*.py")) == sorted(STUDIES)


# The committed notebooks were executed on the tf2.15 stack (02 at the paper preset from its
# cache, the others at the full preset).
@pytest.mark.slow
@one_stack("tf2.21")
@pytest.mark.parametrize("name", list(STUDIES))
def test_notebook_runs_at_the_smoke_preset(name, out):
  notebook = execute(NOTEBOOKS / f"{name}.py", "smoke", out, cell_timeout=900)
  errors = [o for c in notebook.cells for o in c.get("outputs", []) if o.output_type == "error"]
  assert not errors
  closing = "".join(str(o) for o in notebook.cells[-1].get("outputs", []))
  # Each notebook ends saying whether the paper's claims hold here.
  assert any(verdict in closing for verdict in VERDICTS), closing
  for study in STUDIES[name]:
    paths = output_paths(study, out)
    assert_figure_matches_report(paths["json"], paths["png"])
  if name == "01_quickstart":
    text = "".join(o.get("text", "") for c in notebook.cells for o in c.get("outputs", []))
    assert "-DP for adding or removing one example" in text
    assert "held-out AUC of the served model" in text and "epsilon: " in text


@pytest.mark.parametrize("name", list(STUDIES))
def test_committed_notebook_is_its_source_executed_at_the_full_preset(name):
  source = jupytext.read(NOTEBOOKS / f"{name}.py")
  executed = jupytext.read(NOTEBOOKS / f"{name}.ipynb")
  assert [(c.cell_type, c.source) for c in executed.cells] == [
      (c.cell_type, c.source) for c in source.cells]
  code = [c for c in executed.cells if c.cell_type == "code"]
  assert all(c.get("outputs") is not None and c.execution_count for c in code)
  text = "".join(str(o) for c in code for o in c.outputs)
  committed = "paper" if name == "02_criteo_tradeoffs" else "full"
  assert f"'name': '{committed}'" in text or f"preset {committed}:" in text
  assert "Does the paper's claim hold here?" in executed.cells[-2].source
  assert any(verdict in str(code[-1].outputs) for verdict in VERDICTS)
