"""``sparse-dp audit``: an empirical lower bound on the epsilon of the pCTR job.

Trains the pCTR job with each algorithm on synthetic Criteo data plus ``m``
canaries (each included with probability 1/2 from a secret seed), scores the
canaries white-box (every step) and black-box, and reports the one-run lower
bound of Steinke, Nasr and Jagielski (2023) at 95% confidence next to the
epsilon the run claims, with the audit's power (the smallest true epsilon it
flags in 95% of runs of an ideal mechanism) and the canaries' exposure.
``checks`` states the audit's orderings: the non-private run's bound above
every DP run's claim (the audit can see leakage), each broken mechanism's
bound above its claim (noise off, x1/4, x1/2: the audit catches a false
claim), and every DP run's bound below its claim.

A bound below the claim does not prove the claim: it says this audit found
no violation; only the proof and the accountant give the guarantee.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import shlex

from sparse_dp.accounting import Algorithm
from sparse_dp.jobs import job_output
from sparse_dp.jobs.audit.audit_presets import PRESETS
from sparse_dp.jobs.train import job_flags

_ALGORITHMS = [a.value for a in Algorithm]


def add_parser(commands) -> None:
  parser = commands.add_parser("audit", help="empirical epsilon lower bound (canaries)",
                               description=__doc__.splitlines()[0])
  parser.add_argument("--preset", choices=sorted(PRESETS), default="smoke")
  parser.add_argument("--algorithms", default="none,dpsgd,fest,adafest,adafest+",
                      help="comma-separated algorithms to audit")
  parser.add_argument("--epsilon", type=float, default=1.0, help="the DP runs' epsilon")
  parser.add_argument("--canaries", type=int, help="m (default: the preset's)")
  parser.add_argument("--canary-seed", type=int,
                      help="fix the canaries' labels and inclusion (reproducible; default: "
                           "a secret seed from the OS)")
  parser.add_argument("--noise-seed", type=int, help="fix the DP noise (reproducible)")
  parser.add_argument("--confidence", type=float, default=0.95)
  parser.add_argument("--broken-mechanism-for-testing", metavar="ALGORITHM",
                      choices=[a for a in _ALGORITHMS if Algorithm.parse(a).is_private],
                      help="also train ALGORITHM with its noise scaled by each of "
                           "--broken-noise-scales while the accountant still claims "
                           "--epsilon: the audit's negative controls, marked private_run "
                           "false; never a private run")
  parser.add_argument("--broken-noise-scales", default="0,0.25,0.5", metavar="SCALES",
                      help="comma-separated noise scales in [0, 1) of the broken runs "
                           "(0: noise off; default 0,0.25,0.5)")
  parser.add_argument("--out", default="sparse-dp-audit",
                      help="folder for the data and audit.json")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  report = audit_report(args)
  print(json.dumps(report, indent=None if args.json else 2))
  return 0


def audit_report(args: argparse.Namespace) -> dict:
  """Every run's audit and the orderings; also written to ``--out/audit.json``."""
  algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
  unknown = [a for a in algorithms if a not in _ALGORITHMS]
  if unknown or not algorithms:
    raise ValueError(f"--algorithms {args.algorithms!r}: unknown {unknown}; choose from "
                     f"{','.join(_ALGORITHMS)}")
  if not 0 < args.confidence < 1:
    raise ValueError(f"--confidence must be in (0, 1), got {args.confidence}")
  noise_scales = broken_noise_scales(args.broken_noise_scales)
  preset = PRESETS[args.preset]
  if args.canaries is not None:
    if args.canaries < 2:
      raise ValueError(f"--canaries must be >= 2 (an audit guesses among them), got "
                       f"{args.canaries}")
    preset = dataclasses.replace(preset, canaries=args.canaries)
  out = pathlib.Path(args.out)
  with job_output.progress_output(args.json):
    results = _runs(args, preset, algorithms, noise_scales, out)
  report = {"command": command_line(args),
            "preset": args.preset, "settings": dataclasses.asdict(preset),
            "results": results, "checks": orderings(results)}
  out.mkdir(parents=True, exist_ok=True)
  (out / "audit.json").write_text(json.dumps(report, indent=2))
  return report


def broken_noise_scales(text: str) -> list[float]:
  """``--broken-noise-scales``: distinct numbers in ``[0, 1)``, in the order given."""
  try:
    scales = [float(word) for word in text.split(",") if word.strip()]
  except ValueError:
    scales = None
  if not scales or not all(0 <= s < 1 for s in scales) or len(set(scales)) < len(scales):
    raise ValueError(f"--broken-noise-scales {text!r}: give distinct numbers in [0, 1), "
                     "e.g. 0,0.25,0.5")
  return scales


def command_line(args: argparse.Namespace) -> str:
  """The ``sparse-dp audit`` command that repeats this audit (every setting spelled out)."""
  words = ["sparse-dp", "audit", "--preset", args.preset, "--algorithms", args.algorithms,
           "--epsilon", str(args.epsilon), "--confidence", str(args.confidence)]
  for flag in ("canaries", "canary_seed", "noise_seed", "broken_mechanism_for_testing"):
    if getattr(args, flag) is not None:
      words += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
  if args.broken_mechanism_for_testing is not None:
    words += ["--broken-noise-scales", args.broken_noise_scales]
  return shlex.join(words + ["--out", args.out] + (["--json"] if args.json else []))


def _runs(args, preset, algorithms: list[str], noise_scales: list[float],
          out: pathlib.Path) -> list[dict]:
  from sparse_dp.jobs.audit.audit_job import AuditFlags, audited_run
  from sparse_dp.jobs.audit.canaries import Canaries
  from sparse_dp.jobs.study.runner.inputs import SYNTHETIC, StudyInputs
  inputs = StudyInputs.load(SYNTHETIC, preset.examples, preset.scale, preset.features,
                            out / "data")
  canaries = Canaries.draw(preset.canaries, inputs.vocabulary_sizes, args.canary_seed)
  settings = job_flags.FitSettings(
      epsilon=args.epsilon, delta=preset.delta, epochs=preset.epochs,
      batch_size=preset.batch_size, learning_rate=preset.learning_rate,
      hidden_units=preset.hidden_units, noise_seed=args.noise_seed)
  flags = AuditFlags(args.epsilon, 0.1, preset.fest_k)
  beta = 1 - args.confidence
  runs = [(a, 1.0) for a in algorithms]
  if args.broken_mechanism_for_testing:
    runs += [(args.broken_mechanism_for_testing, scale) for scale in noise_scales]
  results = []
  for algorithm, scale in runs:
    print(f"sparse-dp audit: {algorithm}"
          f"{f' (noise x{scale:g}, for testing)' if scale != 1.0 else ''} with "
          f"{canaries.count} canaries", flush=True)
    result = audited_run(algorithm, flags, settings, inputs.train, inputs.held_out,
                         canaries, beta, noise_scale=scale)
    print(power_line(result), flush=True)
    results.append(result)
  return results


def power_line(result: dict) -> str:
  """The run's bound against its claim, and the smallest true epsilon the audit would flag."""
  power = result["power"]
  smallest = power["smallest_epsilon_flagged"]
  seen = (f"flags a true epsilon >= {smallest:.2f} in {power['rate']:.0%} of runs"
          if smallest is not None else "cannot flag any true epsilon in 95% of runs")
  claim = result["claimed_epsilon"]
  return (f"  lower bound {result['epsilon_lower_bound']:.2f} vs claim "
          f"{'-' if claim is None else f'{claim:.2f}'}; the audit {seen} "
          f"(claim {power['claim']:.2f}, {result['canaries']} canaries, {result['tries']} tries)")


def orderings(results: list[dict]) -> dict:
  """The three orderings a sound audit of a correct implementation shows (None: not run)."""
  private = [r for r in results if r["private_run"]]
  controls = [r for r in results if r["claimed_epsilon"] is None]
  broken = [r for r in results if r["noise_scale"] != 1.0]
  largest_claim = max((r["claimed_epsilon"] for r in private), default=None)
  return {
      "positive_control_above_claims": (
          all(r["epsilon_lower_bound"] > largest_claim for r in controls)
          if controls and private else None),
      "broken_mechanisms_above_claim": (
          {f"noise x{r['noise_scale']:g}": r["flagged"] for r in broken} if broken else None),
      "private_runs_below_claims": (
          all(r["epsilon_lower_bound"] < r["claimed_epsilon"] for r in private)
          if private else None),
  }
