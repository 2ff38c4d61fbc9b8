"""Seconds to build one Poisson-subsampled Gaussian step's PLD: ours against dp_accounting's.

``sparse_dp.accounting.gaussian_pld.subsampled_gaussian_pld`` (the grid's divergences in one
numpy pass) against ``dp_accounting``'s ``from_gaussian_mechanism`` (point by point), the two
alternating on each (sigma, q) of a grid at the default interval ``1e-4``, ``--repeats``
times; the median of each, their ratio, and whether the two PLDs give the same epsilon
after 100 steps at ``delta = 1e-6``. Then the user-facing calls the builder speeds up: a
noise calibration and a DP-SGD report.

  python benchmarks/pld_build.py --out benchmarks/results/pld_build.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from importlib import metadata

from dp_accounting.pld import privacy_loss_distribution as pld_lib

from sparse_dp.accounting import BatchSchedule, PrivacyReport, PrivacySpec, calibrate
from sparse_dp.accounting.gaussian_pld import subsampled_gaussian_pld

SIGMAS = (0.5, 0.8, 1.0, 2.0, 5.0)
RATES = (1e-3, 0.01, 0.0625, 0.25)
INTERVAL = 1e-4


def _seconds(build) -> tuple[float, object]:
  start = time.perf_counter()
  pld = build()
  return time.perf_counter() - start, pld


def build_times(repeats: int) -> list[dict]:
  """Median seconds of each builder on each (sigma, q), and the epsilons they give."""
  rows = []
  for sigma in SIGMAS:
    for q in RATES:
      ours, theirs = [], []
      for _ in range(repeats):
        seconds, mine = _seconds(lambda: subsampled_gaussian_pld(sigma, q, INTERVAL))
        ours.append(seconds)
        seconds, reference = _seconds(lambda: pld_lib.from_gaussian_mechanism(
            sigma, sampling_prob=q, value_discretization_interval=INTERVAL))
        theirs.append(seconds)
      epsilons = [p.self_compose(100).get_epsilon_for_delta(1e-6) for p in (mine, reference)]
      rows.append({"sigma": sigma, "sampling_rate": q,
                   "ours_seconds": statistics.median(ours),
                   "dp_accounting_seconds": statistics.median(theirs),
                   "speedup": statistics.median(theirs) / statistics.median(ours),
                   "epsilon_100_steps": epsilons[0],
                   "same_epsilon": epsilons[0] == epsilons[1]})
  return rows


def user_calls() -> dict:
  """Seconds of a calibration and a report, each building its PLDs anew (a fresh process)."""
  seconds, _ = _seconds(lambda: calibrate(
      "adafest", 1.0, 1 / 45_840_617, BatchSchedule.constant(2048 / 45_840_617, 20_000),
      sigma_ratio=2.0))
  report, _ = _seconds(lambda: PrivacyReport.compute(
      PrivacySpec("dpsgd", BatchSchedule.constant(1024 / 100_000, 3000),
                  noise_multiplier=0.8), 1e-5))
  return {"calibrate_adafest_seconds": seconds, "dpsgd_report_seconds": report}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--out", required=True)
  args = parser.parse_args()
  calls = user_calls()
  rows = build_times(args.repeats)
  result = {"dp_accounting": metadata.version("dp-accounting"),
            "python": platform.python_version(), "interval": INTERVAL, "builds": rows,
            "total_ours_seconds": sum(r["ours_seconds"] for r in rows),
            "total_dp_accounting_seconds": sum(r["dp_accounting_seconds"] for r in rows),
            "all_same_epsilon": all(r["same_epsilon"] for r in rows), **calls}
  with open(args.out, "w") as out:
    json.dump(result, out, indent=1)
  print(json.dumps({k: v for k, v in result.items() if k != "builds"}))


if __name__ == "__main__":
  main()
