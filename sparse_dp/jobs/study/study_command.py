"""``sparse-dp study NAME --preset {smoke,full,paper} --data ... --out DIR [--grid FILE]
[--from-cache] [--optimizer NAME] [--learning-rate LR]``."""

from __future__ import annotations

import argparse

from sparse_dp.jobs.study.presets import PRESETS
from sparse_dp.jobs.train.job_flags import OPTIMIZERS

_STUDIES = {"tradeoffs": "Fig. 3 / 8: reduction vs AUC of DP-SGD, DP-FEST, DP-AdaFEST(+)",
            "epsilon": "Fig. 4: each algorithm across epsilon",
            "heatmap": "Fig. 7 / 9: DP-AdaFEST over sigma1/sigma2 x tau",
            "streaming": "Fig. 5: streaming periods, DP-FEST frequency sources",
            "step-time": "Table 4: seconds per step; pCTR throughput by vocabulary scale"}


_GRID_HELP = (
    "a YAML or JSON file of `sparse-dp train` flags, each a value or a list of values, "
    "e.g. {algorithm: [dpsgd, fest, adafest], tau_sigmas: [2, 4], fest_k: [100, 1000], "
    "selection_share: 0.01, seeds: 3, max_examples: 100000}: every combination is a point, "
    "trained at each seed (seeds: a count or a list); a flag an algorithm does not read "
    "adds none of its points; flags not given take the preset's value, then the "
    "command's default; max_examples caps the lines read of --data (default: every "
    "line of real files); examples sets the synthetic examples drawn per data seed "
    "(default: the preset's)")
# What each study asks of its grid's points.
_GRID_POINTS = {
    "tradeoffs": "Give exactly one dpsgd point: the AUC loss is measured from it",
    "epsilon": "Each point is drawn in the panel of its epsilon; no algorithm none",
    "heatmap": "One adafest point per (sigma_ratio, tau_sigmas) cell, at one epsilon"}


def add_parser(commands) -> None:
  parser = commands.add_parser(
      "study", help="Ghazi et al.'s (NeurIPS 2023) trade-off studies (JSON, markdown, PNG)",
      description="Sweeps of the pCTR job repeated over seeds; writes OUT/NAME.json, "
                  ".md and .png (the figure drawn from the JSON); trained runs are cached "
                  "in OUT/runs, so studies sharing points train them once.")
  studies = parser.add_subparsers(dest="study", required=True)
  for name, text in _STUDIES.items():
    study = studies.add_parser(name, help=text, description=text)
    study.add_argument("--preset", choices=list(PRESETS), default="smoke",
                       help="sizes: smoke (CI, minutes), full (about 40 minutes on 2 cores) "
                            "or paper (Ghazi et al.'s Criteo-Kaggle setting, about 12 hours "
                            "on 2 cores, resumable: docs/paper_study.md)")
    study.add_argument("--data", default="synthetic",
                       help="'synthetic' (default) or a path or glob of Criteo files "
                            "(streaming: Criteo-1TB day_N files)")
    study.add_argument("--out", default="study-results", help="output folder")
    study.add_argument("--optimizer", choices=OPTIMIZERS,
                       help="every run's `sparse-dp train --optimizer` (default: the "
                            "preset's, adam); it keeps the preset's learning rate unless "
                            "--learning-rate is given (docs/optimizers.md: row-wise Adagrad "
                            "wants its own)" + (
                                "; Table 4's `sparse-dp bench step` keeps SGD"
                                if name == "step-time" else ""))
    study.add_argument("--learning-rate", type=float,
                       help="every run's step size (default: the preset's)")
    if name in _GRID_POINTS:
      study.add_argument("--grid", metavar="FILE", help=f"{_GRID_HELP}. {_GRID_POINTS[name]}")
    study.add_argument("--from-cache", action="store_true",
                       help="train nothing: report the finished runs in OUT/runs (streams: "
                            "OUT/streams) and list the points not yet trained under "
                            "'missing'" + ("; Table 4 is measured anew (`sparse-dp bench "
                                           "step` trains no model)"
                                           if name == "step-time" else ""))
    study.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  from sparse_dp.jobs.study.reports.tables import markdown
  from sparse_dp.jobs.study.studies import output_paths, run_study
  report = run_study(args.study, args.preset, args.data, args.out, getattr(args, "grid", None),
                     getattr(args, "from_cache", False), args.optimizer, args.learning_rate)
  print(markdown(report))
  print("wrote " + ", ".join(str(p) for p in output_paths(args.study, args.out).values()))
  return 0
