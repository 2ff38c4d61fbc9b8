"""AUC and gradient size of DP-AdaFEST's threshold and noise ratio against DP-SGD's.

Each setting is a list of ``sparse-dp train`` flags; every setting trains on the same data
(``--vocabulary-scale``, ``--light-users``, data seed 0) once per noise seed, and the JSON
holds each run's AUC, epsilon and gradient-size reduction with the mean over the seeds.
What docs/adafest_defaults.md reports::

  python benchmarks/adafest_defaults.py --vocabulary-scale 0.01 --light-users 0.5 \\
      --setting dpsgd="--algorithm dpsgd" \\
      --setting fixed="--algorithm adafest --sigma-ratio 2 --tau-sigmas 4" \\
      --setting rule="--algorithm adafest" \\
      --out benchmarks/results/adafest_defaults/scale0.01_light_users0.5.json

(The committed runs were measured before the rule with its values as flags,
``rule="--algorithm adafest --sigma-ratio 3.179 --tau-sigmas 2.516"``: the same runs.)
"""

from __future__ import annotations

import argparse
import json
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile


def _run(flags: list[str]) -> dict:
  with tempfile.TemporaryDirectory() as out:
    done = subprocess.run([sys.executable, "-m", "sparse_dp", "train", *flags, "--json",
                           "--out", f"{out}/run"], capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"sparse-dp train {shlex.join(flags)} failed:\n{done.stderr[-3000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--setting", action="append", required=True, metavar="NAME=FLAGS")
  parser.add_argument("--vocabulary-scale", default="1")
  parser.add_argument("--light-users", default="0")
  parser.add_argument("--noise-seeds", default="1,2,3")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  data = ["--vocabulary-scale", args.vocabulary_scale, "--light-users", args.light_users]
  out = pathlib.Path(args.out)
  results = json.loads(out.read_text()) if out.exists() else {}
  for setting in args.setting:
    name, _, flags = setting.partition("=")
    kept = results.setdefault(name, {"flags": flags, "data": data, "runs": {}})
    if (kept["flags"], kept["data"]) != (flags, data):
      raise SystemExit(f"{out} holds setting {name!r} with flags {kept['flags']!r} on data "
                       f"{kept['data']}: give another --out or setting name")
    runs = kept["runs"]
    for seed in args.noise_seeds.split(","):
      if seed not in runs:  # resumable: a finished run is kept
        metrics = _run([*data, *shlex.split(flags), "--noise-seed", seed])
        runs[seed] = {key: metrics.get(key) for key in (
            "auc", "epsilon", "gradient_size_reduction", "threshold", "noise_multipliers",
            "sigma_ratio", "threshold_sigmas")}
        out.write_text(json.dumps(results, indent=1))
        print(f"{name} seed {seed}: AUC {runs[seed]['auc']:.4f}", flush=True)
    aucs = [r["auc"] for r in runs.values()]
    reductions = [r["gradient_size_reduction"] for r in runs.values()
                  if r["gradient_size_reduction"] is not None]
    results[name]["mean_auc"] = statistics.fmean(aucs)
    results[name]["mean_reduction"] = statistics.fmean(reductions) if reductions else None
    out.write_text(json.dumps(results, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
