"""Seconds per DP step with and without XLA, ratios taken in one run.

Two settings, each timed in graph mode and with ``jit_compile=True``, in turn, each run in its
own subprocess, ``--repeats`` times: ``table4``, ``sparse-dp bench step`` (the Table-4 model)
for each trainer and vocabulary; ``pctr``, the pCTR job's model, optimizer and ``DPConfig``,
timed by ``benchmarks/per_example_cost.py``'s worker, for each of ``--pctr-algorithms``.
Under XLA a DP step gets each batch padded to its capacity with its example mask, as
``poisson_dataset`` pads it for a compiled model, so the ratio is the one a user sees. Writes
every timing and the median XLA / graph ratio per setting. See benchmarks/README.md
("xla_step_time.py").

    python benchmarks/xla_step_time.py --out benchmarks/results/xla_step_time.json
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

_REPOSITORY = pathlib.Path(__file__).resolve().parent.parent


def step_times(vocab: str, trainers: str, steps: int, xla: bool) -> list:
  command = [sys.executable, "-m", "sparse_dp", "bench", "step", "--vocab", vocab,
             "--trainers", trainers, "--steps", str(steps), "--json"] + (["--xla"] if xla else [])
  done = subprocess.run(command, capture_output=True, text=True, check=True)
  return [{**result, "setting": "table4"}
          for result in json.loads(done.stdout.strip().splitlines()[-1])["results"]]


def pctr_step_time(algorithm: str, steps: int, xla: bool) -> dict:
  """Seconds per step of the pCTR job's model, by ``per_example_cost.py``'s worker."""
  settings = {"algorithm": algorithm, "steps": steps, "warmup_steps": 2, "xla": xla}
  worker = [sys.executable, str(_REPOSITORY / "benchmarks" / "per_example_cost.py"),
            "--worker", "pctr", json.dumps(settings)]
  env = {**os.environ, "PYTHONPATH": str(_REPOSITORY), "TF_ENABLE_ONEDNN_OPTS": "0",
         "TF_CPP_MIN_LOG_LEVEL": "2"}
  done = subprocess.run(worker, capture_output=True, text=True, check=True, env=env)
  result = json.loads(done.stdout.strip().splitlines()[-1])
  return {"setting": "pctr", "trainer": algorithm, "vocab": "pctr", "xla": xla,
          "first_step_seconds": result["first_step_seconds"],
          "seconds_per_step": result["seconds_per_step"], "step_seconds": result["step_seconds"]}


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--vocab", default="100000,1000000,10000000")
  parser.add_argument("--trainers", default="nonprivate,dpsgd,adafest")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--pctr-algorithms", default="none,dpsgd,adafest",
                      help="comma-separated; empty: no pCTR timing")
  parser.add_argument("--pctr-steps", type=int, default=5)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--out", required=True)
  parser.add_argument("--runs-from", help="a log of an earlier run's printed runs (one JSON "
                      "object a line): write its report without measuring again")
  args = parser.parse_args()
  started, runs = time.time(), []
  if args.runs_from:
    lines = pathlib.Path(args.runs_from).read_text().splitlines()
    runs = [json.loads(line) for line in lines if line.startswith('{"')]
  for repeat in range(0 if args.runs_from else args.repeats):
    for xla in (False, True):
      results = step_times(args.vocab, args.trainers, args.steps, xla) if args.vocab else []
      results += [pctr_step_time(algorithm, args.pctr_steps, xla)
                  for algorithm in args.pctr_algorithms.split(",") if algorithm]
      for result in results:
        runs.append({**result, "repeat": repeat})
        print(json.dumps(runs[-1]), flush=True)
  ratios = {}
  for key in sorted({(r["trainer"], r["vocab"]) for r in runs}, key=str):
    paired = [(x["seconds_per_step"], g["seconds_per_step"])
              for x in runs for g in runs
              if (x["trainer"], x["vocab"]) == key == (g["trainer"], g["vocab"])
              and x["xla"] and not g["xla"] and x["repeat"] == g["repeat"]
              and "error" not in x and "error" not in g]
    if paired:
      ratios[f"{key[0]}@{key[1]}"] = statistics.median(x / g for x, g in paired)
  report = {"benchmark": "xla_step_time", "steps": args.steps, "repeats": args.repeats,
            "pctr_steps": args.pctr_steps, "load_average": os.getloadavg(),
            "machine": f"{os.cpu_count()} cores",
            "wall_seconds": (None if args.runs_from else round(time.time() - started)),
            "xla_over_graph": ratios, "runs": runs}
  with open(args.out, "w") as out:
    json.dump(report, out, indent=1)
  print(json.dumps(ratios, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
