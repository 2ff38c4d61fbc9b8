"""Seconds per DP step with and without XLA (issue 21, item 4), ratios taken in one run.

Runs ``sparse-dp bench step`` (the Table-4 model: one table of dim 64, batch
1,024, Zipf ids, SGD) for each trainer and vocabulary twice, graph mode and
``jit_compile=True``, alternating, each in its own subprocess, ``--repeats``
times; writes every timing and the median XLA / graph ratio per setting.
The batches have one fixed size, so XLA compiles once (Poisson batches of
varying size would compile once per size until batches are padded to a
capacity).

    python benchmarks/xla_step_time.py --out benchmarks/results/xla_step_time.json
"""

import argparse
import json
import statistics
import subprocess
import sys
import time


def step_times(vocab: str, trainers: str, steps: int, xla: bool) -> list:
  command = [sys.executable, "-m", "sparse_dp", "bench", "step", "--vocab", vocab,
             "--trainers", trainers, "--steps", str(steps), "--json"] + (["--xla"] if xla else [])
  done = subprocess.run(command, capture_output=True, text=True, check=True)
  return json.loads(done.stdout.strip().splitlines()[-1])["results"]


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--vocab", default="100000,1000000,10000000")
  parser.add_argument("--trainers", default="nonprivate,dpsgd,adafest")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  started, runs = time.time(), []
  for repeat in range(args.repeats):
    for xla in (False, True):
      for result in step_times(args.vocab, args.trainers, args.steps, xla):
        runs.append({**result, "repeat": repeat})
        print(json.dumps(runs[-1]), flush=True)
  ratios = {}
  for key in sorted({(r["trainer"], r["vocab"]) for r in runs}):
    paired = [(x["seconds_per_step"], g["seconds_per_step"])
              for x in runs for g in runs
              if (x["trainer"], x["vocab"]) == key == (g["trainer"], g["vocab"])
              and x["xla"] and not g["xla"] and x["repeat"] == g["repeat"]
              and "error" not in x and "error" not in g]
    if paired:
      ratios[f"{key[0]}@{key[1]}"] = statistics.median(x / g for x, g in paired)
  report = {"benchmark": "xla_step_time", "steps": args.steps, "repeats": args.repeats,
            "wall_seconds": round(time.time() - started), "xla_over_graph": ratios, "runs": runs}
  with open(args.out, "w") as out:
    json.dump(report, out, indent=1)
  print(json.dumps(ratios, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
