"""Seconds of the main job's reading and saving, each route against the one it replaced.

* Reading Criteo lines (``sparse_dp.data.criteo.CriteoReader.parse_lines``), chunks of
  100,000 synthetic lines: the fast path (every line well formed: pandas' C reader)
  against the field-by-field checks, which the same chunk with one malformed line appended
  takes (``on_bad_line="skip"``); the two frames are compared exactly.
* Saving the job's model (26 tables at the Table-3 sizes, 4 x 598 units, Adam, two
  training steps): ``models.pctr.save_model`` (no per-layer traces, the same
  ``serving_default`` signature) against Keras's default ``model.save``, and loading each
  with ``keras.models.load_model``.

The routes alternate, ``--repeats`` times; medians and their ratios are written as JSON.

  python benchmarks/job_io.py --out benchmarks/results/job_io.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

CHUNK_LINES = 100_000


def _seconds(run) -> tuple[float, object]:
  start = time.perf_counter()
  value = run()
  return time.perf_counter() - start, value


def _medians(times: dict) -> dict:
  return {name: statistics.median(values) for name, values in times.items()}


def read_times(chunks: int, repeats: int) -> dict:
  """Median seconds to parse ``chunks`` chunks by each path, and whether the frames agree."""
  import pandas as pd

  from sparse_dp.data.criteo import CriteoReader
  from sparse_dp.data.synthetic import SyntheticCriteo
  lines = list(SyntheticCriteo(scale=1.0, seed=0).lines(1, chunks * CHUNK_LINES))
  parts = [lines[i:i + CHUNK_LINES] for i in range(0, len(lines), CHUNK_LINES)]
  malformed = "1\t2\t3"
  times, same = {"fast_path": [], "field_by_field": []}, True
  for _ in range(repeats):
    seconds, fast = _seconds(lambda: [CriteoReader([]).parse_lines(p, "day", 1) for p in parts])
    times["fast_path"].append(seconds)
    checked_reader = CriteoReader([], on_bad_line="skip")
    seconds, checked = _seconds(lambda: [checked_reader.parse_lines(p + [malformed], "day", 1)
                                         for p in parts])
    times["field_by_field"].append(seconds)
    same = same and checked_reader.skipped_lines == len(parts) and all(
        a.equals(b) for a, b in zip(fast, checked))
    pd.testing.assert_frame_equal(fast[0], checked[0], check_exact=True)
  medians = _medians(times)
  return {"lines": len(lines), **{f"{k}_seconds": v for k, v in medians.items()},
          "speedup": medians["field_by_field"] / medians["fast_path"], "same_frames": same}


def save_times(repeats: int) -> dict:
  """Median seconds to save and load the job's model by each route."""
  import numpy as np

  import sparse_dp  # noqa: F401  (registers the layers load_model rebuilds)
  from sparse_dp._keras import keras
  from sparse_dp.data.criteo_format import NUM_INTEGER, TABLE3_VOCABULARY_SIZES
  from sparse_dp.models import pctr
  model = pctr.build_pctr_model(list(TABLE3_VOCABULARY_SIZES))
  model.compile(optimizer=keras.optimizers.legacy.Adam(3e-3),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  rng = np.random.default_rng(0)
  x = {"integers": rng.normal(size=(512, NUM_INTEGER)).astype(np.float32),
       "categorical": np.stack([rng.integers(0, v, 512) for v in TABLE3_VOCABULARY_SIZES], 1)}
  model.fit(x, rng.integers(0, 2, (512, 1)).astype(np.float32), batch_size=256, verbose=0)
  routes = {"keras_default": lambda path: model.save(path),
            "save_model": lambda path: pctr.save_model(model, path)}
  times = {f"{name}_{what}": [] for name in routes for what in ("save", "load")}
  with tempfile.TemporaryDirectory() as folder:
    for repeat in range(repeats):
      for name, save in routes.items():
        path = os.path.join(folder, f"{name}_{repeat}")
        times[f"{name}_save"].append(_seconds(lambda: save(path))[0])
        times[f"{name}_load"].append(_seconds(lambda: keras.models.load_model(path))[0])
  medians = _medians(times)
  return {**{f"{k}_seconds": v for k, v in medians.items()},
          "save_speedup": medians["keras_default_save"] / medians["save_model_save"],
          "load_speedup": medians["keras_default_load"] / medians["save_model_load"]}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--chunks", type=int, default=2, help="chunks of 100,000 lines")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  result = {"python": platform.python_version(), "load_average_start": os.getloadavg(),
            "read": read_times(args.chunks, args.repeats), "save": save_times(args.repeats)}
  with open(args.out, "w") as out:
    json.dump(result, out, indent=1)
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
