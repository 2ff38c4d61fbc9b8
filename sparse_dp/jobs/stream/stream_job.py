"""``sparse-dp stream``: retrain the pCTR model period by period under one privacy budget.

The training days are cut into periods of ``--streaming-period`` days (Ghazi et al., NeurIPS
2023, §4.3, Table 5); each period warm-starts the weights (not the optimizer) from the
previous period's model, trains on its own days and is evaluated on the evaluation days. Every
spend goes to the ledger in ``--state`` before what it pays for exists, and a period's model
and metrics are published by renaming one folder, so a rerun with the same flags resumes
(a period whose spend is recorded is redone with the same secret noise seed, not charged
again). A job holds the state folder's lock (:mod:`sparse_dp.jobs.stream.stream_lock`) from
before it reads the state until it ends. DP-FEST and DP-AdaFEST+ count buckets on the first
day, all the job's days or a running sum (``--fest-frequencies``), and rows of buckets kept
across selections carry over. See docs/commands/stream.md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re

from sparse_dp.accounting import Algorithm
from sparse_dp.accounting.adafest_defaults import RULE
from sparse_dp.accounting.ledger import check_budget
from sparse_dp.jobs import job_output
from sparse_dp.jobs.train import job_flags

_FREQUENCIES = ("first-day", "all-days", "running")


def add_parser(commands) -> None:
  parser = commands.add_parser("stream", help="retrain period by period under one budget",
                               description=__doc__.splitlines()[0])
  parser.add_argument("--data", default="synthetic",
                      help="'synthetic' (default) or a glob of Criteo-1TB day_N files")
  parser.add_argument("--train-days", default="0-17",
                      help="e.g. 0-17 or 0,1,5-7: Criteo-1TB's day_N files (synthetic: "
                           "days 0-23)")
  parser.add_argument("--eval-days", default="18-23")
  parser.add_argument("--streaming-period", type=int, default=1, help="days per retrain")
  parser.add_argument("--algorithm", default="adafest", choices=[a.value for a in Algorithm])
  parser.add_argument("--total-epsilon", type=float,
                      help="budget of the whole stream (needed to start a state; default 1.0)")
  parser.add_argument("--epsilon-per-period", type=float,
                      help="spend this per period (default: the remaining budget, split "
                           "evenly over this job's periods)")
  parser.add_argument("--fest-frequencies", choices=_FREQUENCIES, default="running")
  parser.add_argument("--examples-per-day", type=int, default=20_000,
                      help="examples per training day (written, for synthetic data)")
  parser.add_argument("--eval-examples-per-day", type=int, default=5_000)
  parser.add_argument("--synthetic-scale", type=float, default=1.0,
                      help="vocabulary sizes of the synthetic data relative to Table 3")
  job_flags.add_light_users_flag(parser)
  job_flags.add_fit_flags(parser)
  job_flags.add_categorical_features_flag(parser)
  parser.add_argument("--state", required=True, help="state folder: ledger, models, metrics")
  parser.add_argument("--wait-for-lock", type=float, default=0.0, metavar="SECONDS",
                      help="when another job runs on --state, wait this long for it to end "
                           "(default 0: exit 2 naming it)")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.set_defaults(run=run)


def parse_days(text: str, flag: str) -> list[int]:
  """``"1-3,7"`` -> ``[1, 2, 3, 7]``."""
  days = []
  for part in text.split(","):
    match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
    if not match or (match.group(2) and int(match.group(2)) < int(match.group(1))):
      raise ValueError(f"{flag} {text!r}: expected days like 0-17 or 0,3,5-7")
    days += range(int(match.group(1)), int(match.group(2) or match.group(1)) + 1)
  if len(set(days)) != len(days):
    raise ValueError(f"{flag} {text!r} names a day twice")
  return days


def run(args: argparse.Namespace) -> int:
  with job_output.progress_output(args.json):
    summary = stream(args)
  if args.json:
    print(json.dumps(summary))
  else:
    for period in summary["periods"]:
      print(f"period {period['period']} (days {period['days']}): AUC {period['auc']:.4f}, "
            f"epsilon spent {period['epsilon_spent']:.4g}, "
            f"gradient-size reduction {period['gradient_size_reduction']:,.0f}x")
    print(f"epsilon spent {summary['epsilon_spent']:.6g} of {summary['epsilon_total']:g}; "
          f"ledger: {summary['ledger']}")
  return 0


# Settings added to the record later, with the value every earlier job ran with.
_SETTINGS_BEFORE_RECORDED = {"optimizer": "adam", "embedding_dim": None,
                             "categorical_features": None, "dense_tables": "none",
                             "light_users": 0.0, "adafest_rule": None}


def _settings_record(args, train_days, eval_days) -> dict:
  """What must not change between a crashed job and its rerun."""
  names = ("data", "streaming_period", "algorithm", "fest_frequencies", "examples_per_day",
           "eval_examples_per_day", "synthetic_scale", "epsilon_per_period", "delta", "epochs",
           "batch_size", "learning_rate", "optimizer", "l2_norm_clip", "contribution_clip",
           "sigma_ratio", "tau", "tau_sigmas", "fest_k", "selection_share", "hidden_units",
           "embedding_dim", "seed", "categorical_features", "dense_tables", "light_users")
  # The threshold rule's constants: a job resumes only under the rule it began with.
  return {"train_days": train_days, "eval_days": eval_days,
          **{name: getattr(args, name) for name in names},
          "adafest_rule": list(RULE)}


def _changed_settings(recorded: dict, settings: dict) -> list[str]:
  """The settings of ``settings`` that differ from ``recorded`` and that its algorithm
  reads: DP-AdaFEST's threshold and ratio only with a contribution map, ``tau_sigmas`` not
  under an absolute ``tau``."""
  unread = set()
  if not Algorithm.parse(settings["algorithm"]).uses_contribution_map:
    unread = {"sigma_ratio", "tau", "tau_sigmas", "adafest_rule"}
  elif settings["tau"] is not None and recorded.get("tau") == settings["tau"]:
    unread = {"tau_sigmas"}
  return [k for k in sorted(settings) if k not in unread and settings[k] != recorded.get(k)]


def stream(args: argparse.Namespace) -> dict:
  """Runs (or resumes) the job; returns the summary ``--json`` prints."""
  job_flags.categorical_features(args)
  job_flags.check_light_users(args)
  train_days = parse_days(args.train_days, "--train-days")
  eval_days = parse_days(args.eval_days, "--eval-days")
  if set(train_days) & set(eval_days):
    raise ValueError("--train-days and --eval-days share days "
                     f"{sorted(set(train_days) & set(eval_days))}")
  if args.streaming_period < 1:
    raise ValueError(f"--streaming-period must be >= 1, got {args.streaming_period}")
  if args.examples_per_day < 10 or args.eval_examples_per_day < 1:
    raise ValueError("--examples-per-day must be >= 10 and --eval-examples-per-day >= 1")
  if args.epsilon_per_period is not None and not args.epsilon_per_period > 0:
    raise ValueError(f"--epsilon-per-period must be > 0, got {args.epsilon_per_period}")
  from sparse_dp.jobs.train import fitting
  # The training flags, and the hardware they need, are checked before any spend.
  periods = -(-len(train_days) // args.streaming_period)
  settings = job_flags.fit_settings(args, epsilon=1.0)
  fitting.check_hardware(settings, [args.algorithm] * periods)
  from sparse_dp.jobs.stream.stream_periods import stream_vocabulary
  job_flags.check_dense_tables(settings, [args.algorithm], stream_vocabulary(args).sizes,
                               args.fest_k)
  delta_total = args.delta if args.delta is not None else 1.0 / (
      len(train_days) * args.examples_per_day)
  check_budget(1.0 if args.total_epsilon is None else args.total_epsilon, delta_total)
  from sparse_dp.distribute import roles
  from sparse_dp.jobs.stream.stream_lock import StateLock
  from sparse_dp.jobs.stream.stream_periods import StreamData

  # A multi-worker cluster's workers but the chief keep their state in folders of their own.
  args.state = str(roles.output_folder(pathlib.Path(args.state)))
  state_folder = pathlib.Path(args.state)
  data = StreamData(args, state_folder)
  data.check_days(train_days + eval_days)
  with StateLock(state_folder, args.wait_for_lock):
    return _run_locked(args, train_days, eval_days, data, delta_total)


def _run_locked(args: argparse.Namespace, train_days: list[int], eval_days: list[int],
                data, delta_total: float) -> dict:
  """The job, while it holds the state's lock: open, plan or resume, run, summarise."""
  from sparse_dp.jobs.stream.stream_periods import run_period
  from sparse_dp.jobs.stream.stream_state import StreamState

  state_folder = pathlib.Path(args.state)
  kind = Algorithm.parse(args.algorithm)
  total = args.total_epsilon
  if total is None and not (state_folder / "stream.json").exists():
    total = 1.0
  state = StreamState.open(state_folder, total, delta_total)
  settings = _settings_record(args, train_days, eval_days)
  job = state.unfinished_job()
  recorded = _recorded_settings(job) if job is not None else None
  changed = _changed_settings(recorded, settings) if job is not None else []
  if changed:
    before_rule = ("; a job begun before their rule ran with --sigma-ratio 2 --tau-sigmas 4"
                   if any(recorded.get(k) == old and settings[k] is None and k in changed
                          for k, old in job_flags.DEFAULTS_BEFORE_RULE.items()) else "")
    raise ValueError(f"{state_folder} has an unfinished job with other settings ("
                     + "; ".join(f"{k} {recorded.get(k)!r}, now {settings[k]!r}" for k in changed)
                     + f"): rerun it with its flags to resume it{before_rule}")
  if job is None:
    _check_model_shape(state, settings, state_folder)
    periods = [train_days[i:i + args.streaming_period]
               for i in range(0, len(train_days), args.streaming_period)]
    selects = [kind.uses_top_k_selection and (
        args.fest_frequencies == "running" or i == 0 and (
            args.fest_frequencies == "all-days" or state.last_period == 0))
        for i in range(len(periods))]
    job = state.start_job(settings, periods, selects, args.selection_share,
                          args.epsilon_per_period)
  held_out = data.inputs(eval_days, args.eval_examples_per_day)
  first_day = state.jobs[0]["periods"][0]["days"][0]
  for plan in job["periods"]:
    run_period(state, job, plan, data, held_out, args, first_day)
  state.finish(job)
  return _summary(state)


def _recorded_settings(job: dict) -> dict:
  """A job's settings; one recorded before a setting existed ran with that setting's value then."""
  return {**_SETTINGS_BEFORE_RECORDED, **job["settings"]}


# Settings that shape the model a new job warm-starts from the last period's weights.
_MODEL_SHAPE = ("categorical_features", "hidden_units", "embedding_dim", "synthetic_scale")


def _check_model_shape(state, settings: dict, state_folder) -> None:
  """Refuses a new job whose model the last job's weights cannot warm-start, before any spend."""
  if not state.jobs:
    return
  last = _recorded_settings(state.jobs[-1])
  changed = [k for k in _MODEL_SHAPE if settings[k] != last.get(k)]
  if changed:
    raise ValueError(f"{state_folder}'s models have other {', '.join(changed)}; a new job "
                     "warm-starts from the last period's weights: keep them, or give another "
                     "--state")


def _summary(state) -> dict:
  periods = []
  for job in state.jobs:
    for plan in job["periods"]:
      metrics_path = state.period_folder(plan["period"]) / "metrics.json"
      if metrics_path.exists():
        periods.append(json.loads(metrics_path.read_text()))
  _plot(periods, state.folder / "stream.png")
  return {"periods": periods, "epsilon_spent": state.ledger.epsilon_spent,
          "epsilon_total": state.ledger.epsilon_total, "ledger": str(state.ledger.path)}


def _plot(periods: list[dict], path: pathlib.Path) -> None:
  from sparse_dp.jobs.train.train_job import _pyplot
  plt = _pyplot()
  figure, (auc_axis, epsilon_axis) = plt.subplots(1, 2, figsize=(8, 3))
  numbers = [p["period"] for p in periods]
  auc_axis.plot(numbers, [p["auc"] for p in periods], marker="o")
  auc_axis.set(xlabel="period", title="held-out AUC (evaluation days)")
  epsilon_axis.plot(numbers, [p["epsilon_spent"] for p in periods], marker="o")
  epsilon_axis.set(xlabel="period", title="epsilon spent so far")
  figure.tight_layout()
  figure.savefig(path)
  plt.close(figure)
