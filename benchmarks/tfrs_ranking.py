"""Test RMSE of the TFRS ranking walk-through (docs/tfrs_ranking.md) by algorithm and epsilon.

Runs the page's own code block, each time with its ``ALGORITHM, EPSILON = ...`` and
``BATCH_SIZE, CLIP, START, DENSE_TABLES = ...`` lines replaced (the tutorial's batch, and the page's
recipe that learns), in a subprocess, and writes each run's printed RMSE, epsilon and
reduction, with the RMSE of a constant predictor (the training ratings' mean) beside them::

  python benchmarks/tfrs_ranking.py --epsilons 1,4,16 --out benchmarks/results/tfrs_ranking.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import subprocess
import sys

import numpy as np

from sparse_dp.data.synthetic_ratings import SyntheticRatings

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "tfrs_ranking.md"
SETTING = re.compile(r'^ALGORITHM, EPSILON = .*\nBATCH_SIZE, CLIP, START, DENSE_TABLES = .*$',
                     re.MULTILINE)
# The page's two ways to train: the tutorial's batch, and one that learns under DP.
RECIPES = {"tutorial": (8192, 1.0, 0.0), "learns": (1024, 5.0, 3.0)}
# Each epsilon's runs: algorithm and dense_tables.
PRIVATE = (("dpsgd", ()), ("adafest", ()), ("adafest", "auto"))
PRINTED = re.compile(r"test RMSE (\S+) at epsilon (\S+); (\S+)x fewer rows")


def walkthrough() -> str:
  """The page's Python block."""
  return re.search(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)[1]


def tutorial(code: str) -> str:
  """The page's code as the tutorial trains it, without DP: the batch's mean loss, shuffled
  batches of 8,192, no ``make_private``."""
  plain = code.replace("MeanSquaredError(reduction=tf.keras.losses.Reduction.NONE)",
                       "MeanSquaredError()")
  plain = re.sub(r"private = sparse_dp\.make_private\(.*?callbacks=\[private\.callback\(\)\]\)",
                 "history = model.fit(tf.data.Dataset.from_tensor_slices(train).shuffle("
                 "100_000, seed=42).batch(BATCH_SIZE), epochs=3, verbose=0)", plain,
                 flags=re.DOTALL)
  plain = plain.replace("private.epsilon()", "float('nan')")
  if plain.count("make_private") or "Reduction.NONE" in plain:
    raise ValueError(f"{PAGE} changed: its code no longer reads as the tutorial made private")
  return plain


def run(code: str, recipe: str, algorithm: str, epsilon: float, dense_tables=()) -> dict:
  if algorithm == "none":
    code = tutorial(code)
  batch, clip, start = RECIPES[recipe]
  done = subprocess.run([sys.executable, "-c", SETTING.sub(
      f"ALGORITHM, EPSILON = {algorithm!r}, {epsilon!r}\n"
      f"BATCH_SIZE, CLIP, START, DENSE_TABLES = {batch}, {clip}, {start}, {dense_tables!r}",
      code)], capture_output=True, text=True, check=False)
  found = PRINTED.search(done.stdout)
  if done.returncode and "leaving DP-AdaFEST nothing to select" in done.stderr:
    return {"recipe": recipe, "algorithm": algorithm, "dense_tables": dense_tables,
            "target_epsilon": epsilon, "refused": "every table dense: use dpsgd"}
  if done.returncode or not found:
    raise RuntimeError(f"{algorithm} at epsilon {epsilon} failed:\n{done.stderr[-3000:]}")
  rmse, spent, reduction = map(float, found.groups())
  private = algorithm != "none"
  return {"recipe": recipe, "algorithm": algorithm, "dense_tables": dense_tables or None,
          "target_epsilon": epsilon if private else None,
          "epsilon": spent if private else None, "test_rmse": rmse,
          "gradient_size_reduction": reduction}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--epsilons", default="1,4,16")
  parser.add_argument("--out", required=True)
  args = parser.parse_args(argv)
  code = walkthrough()
  ratings = SyntheticRatings().draw()["user_rating"]
  runs = []
  for recipe in RECIPES:
    runs.append(run(code, recipe, "none", 1.0))
    for epsilon in map(float, args.epsilons.split(",")):
      runs += [run(code, recipe, algorithm, epsilon, dense) for algorithm, dense in PRIVATE]
      print(runs[-len(PRIVATE):], flush=True)
  constant = float(np.sqrt(np.mean((ratings[80_000:] - ratings[:80_000].mean()) ** 2)))
  pathlib.Path(args.out).write_text(json.dumps(
      {"constant_predictor_rmse": constant, "runs": runs}, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
