"""Memory of reading a study's examples: the text frame, or each chunk encoded as read.

A study (``sparse-dp study``) holds its examples in memory as the model's arrays. It used to
read every line into one pandas frame of strings
(:class:`sparse_dp.models.pctr_data.CriteoSplit`) and encode the frame after; it now encodes
each chunk of 100,000 lines as it is read (:class:`sparse_dp.models.pctr_data.EncodedSplit`).
Each way reads the first ``--examples`` lines of a Criteo file in its own subprocess and
reports its peak resident memory (``ru_maxrss``) and seconds; ``bytes_per_further_example``
is the slope of the peak between the smallest and the largest size. See benchmarks/README.md
("study_read_memory.py").

  python benchmarks/study_read_memory.py --examples 500000,1000000 \\
      --out benchmarks/results/study_read_memory.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import subprocess
import sys
import tempfile

# Each measurement: a fresh interpreter imports the reader, notes its peak memory, reads.
_MEASURE = """
import json, resource, sys, time
from sparse_dp.models import pctr_data
path, examples, way = sys.argv[1], int(sys.argv[2]), sys.argv[3]
vocabulary = pctr_data.hashed_vocabulary(1.0)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
if way == "frames":
  split = pctr_data.CriteoSplit.read([path], examples, "error")
  arrays = [pctr_data.model_inputs(split.train, vocabulary),
            pctr_data.model_inputs(split.held_out, vocabulary)]
else:
  split = pctr_data.EncodedSplit.read([path], examples, "error", vocabulary)
  arrays = [split.train, split.held_out]
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"examples": sum(len(y) for _, y in arrays), "seconds": seconds,
                  "peak_kib": after, "import_peak_kib": before}))
"""

WAYS = ("frames", "encoded")


def measure(path: pathlib.Path, examples: int, way: str) -> dict:
  done = subprocess.run([sys.executable, "-c", _MEASURE, str(path), str(examples), way],
                        capture_output=True, text=True, check=True)
  result = json.loads(done.stdout.strip().splitlines()[-1])
  growth = (result["peak_kib"] - result["import_peak_kib"]) * 1024
  return {**result, "growth_bytes": growth, "bytes_per_example": growth / result["examples"]}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--examples", default="500000,1000000",
                      help="comma-separated line counts read (the first lines of the file)")
  parser.add_argument("--data", help="a Criteo file (default: a synthetic day drawn once)")
  parser.add_argument("--folder", default=None, help="where the synthetic day is drawn")
  parser.add_argument("--repeats", type=int, default=1)
  parser.add_argument("--out", default="benchmarks/results/study_read_memory.json")
  args = parser.parse_args(argv)
  sizes = sorted(int(n) for n in args.examples.split(","))
  path = pathlib.Path(args.data) if args.data else None
  if path is None:
    from sparse_dp.data.synthetic import SyntheticCriteo
    folder = pathlib.Path(args.folder or tempfile.mkdtemp(prefix="read_memory_"))
    path = folder / f"synthetic_scale1_{sizes[-1]}.gz"
    if not path.exists():
      SyntheticCriteo(scale=1.0).write_day(path, 1, sizes[-1])
  runs = {way: {n: [] for n in sizes} for way in WAYS}
  for _ in range(args.repeats):
    for n in sizes:
      for way in WAYS:
        runs[way][n].append(measure(path, n, way))
  median = {way: {n: {key: statistics.median(r[key] for r in runs[way][n])
                      for key in ("peak_kib", "bytes_per_example", "seconds")}
                  for n in sizes} for way in WAYS}
  slope = {way: ((median[way][sizes[-1]]["peak_kib"] - median[way][sizes[0]]["peak_kib"])
                 * 1024 / (sizes[-1] - sizes[0]) if len(sizes) > 1 else None)
           for way in WAYS}
  report = {"data": str(path), "examples": sizes, "repeats": args.repeats,
            "machine": platform.platform(), "python": platform.python_version(),
            "runs": runs, "median": median, "bytes_per_further_example": slope,
            "peak_ratio_frames_over_encoded": {
                n: median["frames"][n]["peak_kib"] / median["encoded"][n]["peak_kib"]
                for n in sizes}}
  pathlib.Path(args.out).write_text(json.dumps(report, indent=1))
  print(json.dumps({"median": median, "bytes_per_further_example": slope}, indent=1))
  print(f"wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
