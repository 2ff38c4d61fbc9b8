"""Execute the notebooks under ``notebooks/`` top to bottom in a fresh kernel.

The kernel is this interpreter (a kernel spec written to a scratch folder and
put first on ``JUPYTER_PATH``), so a fresh virtual environment runs them
without registering anything. The notebooks read their parameters from the
environment (``SPARSE_DP_STUDY_PRESET``, ``_DATA``, ``_OUT``, ``_FROM_CACHE`` and
``_OPTIMIZER`` and ``_LEARNING_RATE``, empty for the preset's).

``python -m sparse_dp.jobs.study.notebooks --preset full --out benchmarks/results/study``
executes every notebook from its jupytext ``.py`` source and writes the
executed ``.ipynb`` beside it. The committed trade-off notebook is the paper preset
drawn from its committed run cache (``--preset paper --from-cache --out
benchmarks/results/study/paper notebooks/02_criteo_tradeoffs.py``); the others carry
the full preset's outputs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import tempfile
import time
from typing import Iterator, Optional

from sparse_dp.jobs.study.presets import PRESETS
from sparse_dp.jobs.train.job_flags import OPTIMIZERS

# The notebooks ship with the repository, not the installed package: run from its root.
NOTEBOOKS = pathlib.Path("notebooks")
KERNEL = "sparse-dp-study"


@contextlib.contextmanager
def this_interpreter_kernel() -> Iterator[str]:
  """A Jupyter kernel spec named :data:`KERNEL` that runs ``sys.executable``."""
  with tempfile.TemporaryDirectory() as folder:
    spec = pathlib.Path(folder) / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python"}))
    with _environment(JUPYTER_PATH=os.pathsep.join(
        [folder] + [p for p in [os.environ.get("JUPYTER_PATH")] if p])):
      yield KERNEL


@contextlib.contextmanager
def _environment(**values: str):
  saved = {key: os.environ.get(key) for key in values}
  os.environ.update(values)
  try:
    yield
  finally:
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value


def execute(source: pathlib.Path, preset: str, out: pathlib.Path, data: str = "synthetic",
            cell_timeout: Optional[int] = None, optimizer: Optional[str] = None,
            learning_rate: Optional[float] = None, from_cache: bool = False):
  """Runs the notebook of ``source`` (``.py`` or ``.ipynb``) in a fresh kernel of this
  interpreter, in the folder ``out``, its studies trained with ``optimizer`` and
  ``learning_rate`` (None: the preset's), or drawn from ``out/runs`` alone where
  ``from_cache``; returns the executed notebook (``nbformat``)."""
  import jupytext
  from nbclient import NotebookClient
  notebook = jupytext.read(source)
  out = pathlib.Path(out).resolve()
  out.mkdir(parents=True, exist_ok=True)
  with this_interpreter_kernel() as kernel, _environment(
      SPARSE_DP_STUDY_PRESET=preset, SPARSE_DP_STUDY_DATA=data, SPARSE_DP_STUDY_OUT=str(out),
      SPARSE_DP_STUDY_OPTIMIZER=optimizer or "", SPARSE_DP_STUDY_FROM_CACHE=str(int(from_cache)),
      SPARSE_DP_STUDY_LEARNING_RATE="" if learning_rate is None else repr(learning_rate),
      TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "3")):
    NotebookClient(notebook, kernel_name=kernel, timeout=cell_timeout,
                   resources={"metadata": {"path": str(out)}}).execute()
  notebook.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                     "name": "python3"}
  return notebook


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--preset", choices=list(PRESETS), default="smoke")
  parser.add_argument("--data", default="synthetic")
  parser.add_argument("--out", default="study-results")
  parser.add_argument("--optimizer", choices=OPTIMIZERS,
                      help="every study's runs (default: the preset's); `sparse-dp study --help`")
  parser.add_argument("--learning-rate", type=float, help="default: the preset's")
  parser.add_argument("--from-cache", action="store_true",
                      help="train nothing: draw the cached studies from OUT/runs (the "
                           "trade-off notebook; `sparse-dp study --from-cache`)")
  parser.add_argument("notebooks", nargs="*", help="default: every notebooks/*.py")
  args = parser.parse_args(argv)
  import jupytext
  sources = [pathlib.Path(n) for n in args.notebooks] or sorted(NOTEBOOKS.glob("[0-9]*.py"))
  if not sources:
    parser.error(f"no notebook in {NOTEBOOKS.resolve()}: run from the repository's root or "
                 "name the notebooks/*.py files")
  for source in sources:
    start = time.perf_counter()
    notebook = execute(source, args.preset, pathlib.Path(args.out), args.data,
                       optimizer=args.optimizer, learning_rate=args.learning_rate,
                       from_cache=args.from_cache)
    jupytext.write(notebook, source.with_suffix(".ipynb"))
    print(f"{source.name}: {time.perf_counter() - start:.0f} s", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
