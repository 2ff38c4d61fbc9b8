"""``sparse-dp privacy``: epsilon of a run, or the noise that meets a target.

The counterpart of TF Privacy's ``compute_dp_sgd_privacy`` for all four
algorithms of Ghazi et al. (NeurIPS 2023).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional

from sparse_dp.accounting import (
  Algorithm,
  BatchSchedule,
  PrivacyReport,
  PrivacySpec,
  calibrate,
  steps_for_epochs,
)
from sparse_dp.accounting.adafest_defaults import AdaFestSettings, adafest_settings
from sparse_dp.accounting.algorithms import check_positive
from sparse_dp.accounting.discretization import DEFAULT_INTERVAL, pld_interval

_PRIVATE = [a.value for a in Algorithm if a.is_private]
PAPER_SIGMA_RATIO = 5.0  # sigma1 / sigma2 of Ghazi et al.'s Criteo experiments


def add_parser(commands) -> None:
  parser = commands.add_parser(
      "privacy", help="compute epsilon, or calibrate noise to a target epsilon",
      description="Compute the (epsilon, delta) of a DP-SGD, DP-FEST, DP-AdaFEST "
                  "or DP-AdaFEST+ run, or the smallest noise meeting --target-epsilon.")
  parser.add_argument("--algorithm", required=True, choices=_PRIVATE)
  parser.add_argument("--num-examples", type=int, required=True, metavar="N")
  parser.add_argument("--batch-size", type=float, required=True, metavar="B",
                      help="expected batch size; the sampling rate is q = B/N")
  length = parser.add_mutually_exclusive_group(required=True)
  length.add_argument("--steps", type=int, metavar="T")
  length.add_argument("--epochs", type=float, metavar="E", help="steps = ceil(E / q)")
  parser.add_argument("--delta", type=float, metavar="D", help="default 1/N")
  parser.add_argument("--accountant", choices=["pld", "rdp"], default="pld")
  parser.add_argument("--noise-multiplier", type=float, metavar="S",
                      help="dpsgd, fest: Gaussian noise multiplier")
  parser.add_argument("--sigma1", type=float, metavar="S1",
                      help="adafest, adafest+: noise multiplier of the contribution map")
  parser.add_argument("--sigma2", type=float, metavar="S2",
                      help="adafest, adafest+: noise multiplier of the gradient")
  parser.add_argument("--fest-epsilon", type=float, metavar="E1",
                      help="fest, adafest+: pure-DP epsilon of the top-k preselection")
  parser.add_argument("--target-epsilon", type=float, metavar="E",
                      help="calibrate the noise to this epsilon instead")
  parser.add_argument("--sigma-ratio", type=float, metavar="R",
                      help="adafest, adafest+ with --target-epsilon: sigma1/sigma2 (the "
                           "epsilon does not depend on it, only the split of the noise); "
                           f"default: by the rule with --table-rows, else {PAPER_SIGMA_RATIO:g}, "
                           "the paper's")
  parser.add_argument("--table-rows", type=int, nargs="+", metavar="V",
                      help="adafest, adafest+ with --target-epsilon: the rows of each table "
                           "the selection covers; the threshold, and sigma1/sigma2 unless "
                           "--sigma-ratio is given, then follow the rule make_private and "
                           "sparse-dp train use (docs/adafest_defaults.md)")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  algorithm = Algorithm(args.algorithm)
  if args.num_examples <= 0:
    raise ValueError(f"--num-examples must be > 0, got {args.num_examples}")
  if args.batch_size <= 0:
    raise ValueError(f"--batch-size must be > 0, got {args.batch_size:g}")
  sampling_rate = args.batch_size / args.num_examples
  if sampling_rate > 1:
    raise ValueError(f"--batch-size {args.batch_size:g} exceeds --num-examples "
                     f"{args.num_examples}: the sampling rate q = B/N must be <= 1")
  steps = args.steps if args.steps is not None else steps_for_epochs(args.epochs, sampling_rate)
  schedule = BatchSchedule.constant(sampling_rate, steps)
  delta = args.delta if args.delta is not None else 1.0 / args.num_examples
  _check_flags(args, algorithm)
  if args.delta is not None and args.delta >= 1.0 / args.num_examples:
    print(f"sparse-dp privacy: warning: --delta {args.delta:g} >= 1/N = "
          f"{1.0 / args.num_examples:g}; delta should be much smaller than 1/N, since "
          "delta = 1/N allows releasing one example outright", file=sys.stderr)
  rule = _adafest_rule(args, algorithm)
  if args.target_epsilon is not None:
    # the rule's settings already hold a given --sigma-ratio
    ratio = rule.sigma_ratio if rule else (
        args.sigma_ratio if args.sigma_ratio is not None else PAPER_SIGMA_RATIO)
    spec = calibrate(algorithm, args.target_epsilon, delta, schedule, args.accountant,
                     sigma_ratio=ratio, selection_epsilon=args.fest_epsilon or 0.0)
  else:
    spec = PrivacySpec(algorithm=algorithm, schedule=schedule,
                       noise_multiplier=args.noise_multiplier, sigma1=args.sigma1,
                       sigma2=args.sigma2, selection_epsilon=args.fest_epsilon or 0.0)
  report = PrivacyReport.compute(spec, delta, args.accountant,
                                 num_examples=args.num_examples)
  note = _discretization_note(spec, args.accountant)
  if args.json:
    out = report.to_dict()
    if args.target_epsilon is not None:
      out["target_epsilon"] = args.target_epsilon
    if rule:
      out["threshold_sigmas"] = rule.threshold_sigmas
    if note:
      out["note"] = note
    print(json.dumps(out))
  else:
    print("\n".join(filter(None, [_with_threshold(report.statement(), rule), note])))
  return 0


def _with_threshold(statement: str, rule: Optional[AdaFestSettings]) -> str:
  """``statement`` with the rule's threshold after its noise line (unchanged without one)."""
  if rule is None:
    return statement
  lines = statement.split("\n")
  noise = next(i for i, line in enumerate(lines) if line.startswith("  Noise:"))
  lines.insert(noise + 1, f"  Threshold: tau = {rule.threshold_sigmas:.4g} sigma1 C1, by the "
                          "rule on the tables (docs/adafest_defaults.md)")
  return "\n".join(lines)


def _adafest_rule(args: argparse.Namespace, algorithm: Algorithm) -> Optional[AdaFestSettings]:
  """The threshold rule's settings for ``--table-rows`` (the ratio only where not given),
  or ``None`` without the flag."""
  if args.table_rows is None:
    return None
  if not algorithm.uses_contribution_map or args.target_epsilon is None:
    raise ValueError("--table-rows only applies to adafest and adafest+ with --target-epsilon")
  if min(args.table_rows) <= 0:
    raise ValueError(f"--table-rows must be > 0 each, got {min(args.table_rows)}")
  return adafest_settings(args.table_rows, args.batch_size, sigma_ratio=args.sigma_ratio)


def _discretization_note(spec: PrivacySpec, accountant: str) -> str:
  """Says so when the PLD grid was widened to fit in memory, else ''."""
  if accountant != "pld":
    return ""
  interval = pld_interval(spec.accountant(accountant).training_event())
  if interval <= DEFAULT_INTERVAL:
    return ""
  return (f"Note: the PLD was discretised at interval {interval:.3g} instead of "
          f"{DEFAULT_INTERVAL:g} so that it fits in memory; the grid is pessimistic, "
          "so the epsilon is still an upper bound, slightly less tight.")


def _check_flags(args: argparse.Namespace, algorithm: Algorithm) -> None:
  """Rejects flags that do not belong to ``algorithm`` or to the chosen mode."""
  name = algorithm.value
  def given(*flags):
    return [f for f in flags if getattr(args, f.lstrip("-").replace("-", "_")) is not None]
  if algorithm.uses_contribution_map:
    wrong = given("--noise-multiplier")
    noise = given("--sigma1", "--sigma2")
    needs = "--sigma1 S1 --sigma2 S2"
  else:
    wrong = given("--sigma1", "--sigma2", "--sigma-ratio")
    noise = given("--noise-multiplier")
    needs = "--noise-multiplier S"
  if not algorithm.uses_top_k_selection:
    wrong += given("--fest-epsilon")
  elif args.fest_epsilon is None:
    raise ValueError(f"--algorithm {name} needs --fest-epsilon E1, the top-k "
                     "preselection's budget (the paper uses 0.01)")
  if wrong:
    raise ValueError(f"{', '.join(wrong)} does not apply to --algorithm {name}")
  if args.target_epsilon is not None:
    if noise:
      raise ValueError(f"give either --target-epsilon or {' '.join(noise)}, not both")
    if args.sigma_ratio is not None:
      check_positive("--sigma-ratio (sigma1/sigma2)", args.sigma_ratio)
  elif args.sigma_ratio is not None:
    raise ValueError("--sigma-ratio only applies with --target-epsilon")
  elif len(noise) != len(needs.split()) // 2:
    raise ValueError(f"--algorithm {name} needs {needs} or --target-epsilon E")
