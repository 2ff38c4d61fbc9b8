"""Where a test tier's time goes: per test file, wall seconds, tracing and ``fit`` (issue 43).

Runs ``pytest -m <marker> <tests>`` in a subprocess with this module as a plugin. The plugin
times, per test file, every test's wall time, TensorFlow's tracing of ``tf.function``s (its
``_create_concrete_function``, each trace once even when nested) and Keras's ``Model.fit``
(its tracing included), and writes them as JSON, largest files first::

  python benchmarks/tier_profile.py --out benchmarks/results/tier_profile.json

Run it alone on the machine: the tier's times are what one stack's CI run pays, less the
other stack's share of the cores.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import pathlib
import platform
import subprocess
import sys
import time

_OUT = "TEST_TIER_PROFILE_OUT"
_by_file: dict = collections.defaultdict(collections.Counter)
_current = {"file": None, "depth": 0}


def _timed(owner, name: str, key: str, outermost_only: bool = False) -> None:
  """Replaces ``owner.name`` by a wrapper adding its seconds and calls to ``key``."""
  original = getattr(owner, name)

  @functools.wraps(original)
  def wrapper(*args, **kwargs):
    nested = outermost_only and _current["depth"] > 0
    _current["depth"] += outermost_only
    start = time.perf_counter()
    try:
      return original(*args, **kwargs)
    finally:
      _current["depth"] -= outermost_only
      if _current["file"] and not nested:
        _by_file[_current["file"]][f"{key}_seconds"] += time.perf_counter() - start
        _by_file[_current["file"]][f"{key}_calls"] += 1

  setattr(owner, name, wrapper)


def pytest_configure(config):  # noqa: ARG001 (pytest's hook signature)
  """Installs the timers once the session starts (``sparse_dp`` is imported by conftest)."""
  from tensorflow.python.eager.polymorphic_function import tracing_compilation

  from sparse_dp import keras
  _timed(tracing_compilation, "_create_concrete_function", "trace", outermost_only=True)
  _timed(keras.Model, "fit", "fit")


def pytest_runtest_protocol(item, nextitem):  # noqa: ARG001
  """Charges everything a test runs (setup, call, teardown) to its file."""
  _current["file"] = item.nodeid.split("::")[0]
  _by_file[_current["file"]]["tests"] += 1


def pytest_runtest_logreport(report):
  """Adds each phase's duration to the test's file."""
  _by_file[report.nodeid.split("::")[0]]["seconds"] += report.duration


def pytest_sessionfinish(session):  # noqa: ARG001
  """Writes the per-file counters where the parent process asked."""
  path = os.environ.get(_OUT)
  if path:
    pathlib.Path(path).write_text(json.dumps({k: dict(v) for k, v in _by_file.items()}))


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--marker", default="not slow", help="pytest -m (default: the fast tier)")
  parser.add_argument("--tests", nargs="*", default=["tests"], help="what pytest collects")
  parser.add_argument("--out", required=True, help="the JSON file to write")
  args = parser.parse_args(argv)
  root = pathlib.Path(__file__).resolve().parents[1]
  counters = pathlib.Path(args.out).resolve().with_suffix(".files.tmp")
  env = {**os.environ, _OUT: str(counters),
         "PYTHONPATH": os.pathsep.join(filter(None, [str(root / "benchmarks"),
                                                      os.environ.get("PYTHONPATH")]))}
  start = time.perf_counter()
  done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tier_profile",
                         "-p", "no:cacheprovider", "-m", args.marker, *args.tests],
                        cwd=root, env=env, check=False)
  wall = time.perf_counter() - start
  if not counters.exists():  # pytest stopped before its session ended (a usage error)
    print(f"tier_profile: pytest exited with code {done.returncode} before writing its "
          "counters; see its output above", file=sys.stderr)
    return done.returncode or 1
  files = json.loads(counters.read_text())
  counters.unlink()
  totals = collections.Counter()
  for counts in files.values():
    totals.update(counts)
  result = {"benchmark": "tier_profile", "command": " ".join(sys.argv),
            "marker": args.marker, "pytest_exit_code": done.returncode,
            "wall_seconds": round(wall, 1), "load_average_end": os.getloadavg(),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "totals": {k: round(v, 1) for k, v in totals.items()},
            "files": dict(sorted(((name, {k: round(v, 2) for k, v in counts.items()})
                                  for name, counts in files.items()),
                                 key=lambda item: -item[1].get("seconds", 0)))}
  pathlib.Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
  print(json.dumps(result["totals"]))
  return done.returncode


if __name__ == "__main__":
  sys.exit(main())
