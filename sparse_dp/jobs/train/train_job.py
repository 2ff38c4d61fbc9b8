"""``sparse-dp train``: train the Criteo pCTR model with a DP algorithm and report.

Reads Criteo files (or writes a synthetic Criteo day first, the default), holds
out the last 10% of examples for evaluation, encodes them with a vocabulary
that does not depend on the private data (:mod:`sparse_dp.models.pctr_data`),
trains with ``sparse_dp.make_private`` on Poisson-sampled batches, and
reports held-out AUC and calibration (:mod:`sparse_dp.models.calibration`) with the epsilon
spent. Writes to ``--out`` the SavedModel, ``vocabulary.json``, ``metrics.json``, the plots
and, with ``--reader pandas``, the keyed record of training examples
(:mod:`sparse_dp.data.training_examples`; its key goes to ``--secrets-dir``, never under
``--out``). With ``--compare A,B`` every algorithm trains on the same examples and split at
the same epsilon, in ``--out/<algorithm>/``, tabulated in ``compare.json``, ``compare.md``
and ``compare.png``. See docs/commands/train.md.
"""

from __future__ import annotations

import argparse
import glob
import json
import pathlib
import time

from sparse_dp.accounting import Algorithm
from sparse_dp.accounting.report import epsilon_caveat
from sparse_dp.jobs import job_output
from sparse_dp.jobs.output_folder import claim_output_folder, record_outputs
from sparse_dp.jobs.sample import sample_job
from sparse_dp.jobs.train import job_flags

_ALGORITHMS = [a.value for a in Algorithm]


def add_parser(commands) -> None:
  parser = commands.add_parser("train", help="train the Criteo pCTR model (main job)",
                               description=__doc__.splitlines()[0])
  parser.add_argument("--data", default="synthetic",
                      help="'synthetic' (default) or a path or glob of Criteo files")
  parser.add_argument("--algorithm", default="adafest", choices=_ALGORITHMS)
  parser.add_argument("--compare", metavar="A,B,...",
                      help="train each of these algorithms on the same data and compare")
  parser.add_argument("--epsilon", type=float, default=1.0)
  parser.add_argument("--max-examples", type=int, default=400_000,
                      help="examples read (and written, for synthetic data); 0: every line "
                           "(--reader tfdata only)")
  parser.add_argument("--reader", choices=["pandas", "tfdata", "batches"], default="pandas",
                      help="pandas: read into memory, hold out the last 10%%; tfdata: stream "
                           "--data from disk (files larger than memory), evaluate on "
                           "--eval-data; batches: the Poisson batches of `sparse-dp sample` "
                           "(--data: its --out folder), one per step, evaluate on --eval-data")
  parser.add_argument("--eval-data", help="held-out Criteo files (path or glob) of --reader "
                                          "tfdata; synthetic data writes its own")
  parser.add_argument("--max-eval-examples", type=int, default=100_000,
                      help="held-out examples read with --reader tfdata")
  job_flags.add_fit_flags(parser)
  job_flags.add_categorical_features_flag(parser)
  sample_job.add_flags(parser)
  parser.add_argument("--vocabulary", default="hashed",
                      help="'hashed' (default; data-independent), 'counted' (non-private "
                           "runs only) or a vocabulary JSON file built on public data")
  parser.add_argument("--vocabulary-scale", type=float, default=1.0, metavar="S",
                      help="tables S x the paper's Table 3 vocabularies (S > 0, default 1): "
                           "--data synthetic writes data at that scale, real files are hashed "
                           "into those sizes (--vocabulary hashed)")
  job_flags.add_light_users_flag(parser)
  parser.add_argument("--min-count", type=int, default=1,
                      help="frequency threshold of --vocabulary counted")
  parser.add_argument("--calibration-share", type=float, metavar="S",
                      help="share of --epsilon spent after training on a private Platt "
                           "scaling of the logit, fitted on the training examples "
                           "(docs/calibration.md; default 0.05 for a DP run with --reader "
                           "pandas on one machine, else 0; 0: off)")
  parser.add_argument("--out", default="sparse-dp-train",
                      help="output folder, new or empty (see --overwrite)")
  parser.add_argument("--overwrite", action="store_true",
                      help="clear --out first when it holds an earlier run's outputs (a "
                           "folder that holds anything else is refused all the same)")
  parser.add_argument("--secrets-dir", metavar="DIR",
                      help="where the key of the training examples' record is written "
                           "(--reader pandas; 'distill --teacher' needs it), outside --out: "
                           "default $SPARSE_DP_SECRETS_DIR, else ~/.sparse_dp/keys")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  algorithms = _algorithms(args)
  with job_output.progress_output(args.json):
    results = train(args, algorithms)
  if args.compare:
    if args.json:
      print(json.dumps({"results": results}))
    else:
      print(_markdown_table(results))
  else:
    (metrics,) = results
    print(json.dumps(metrics) if args.json else
          "\n".join(f"{k}: {_with_caveat(k, v, metrics)}" for k, v in metrics.items()))
  return 0


def _with_caveat(key: str, text, metrics: dict):
  """An epsilon printed for batches that were not Poisson-sampled says so in its line."""
  if key.endswith("epsilon") and text not in (None, "-") and metrics["poisson_sampling"] is False:
    return f"{text}{epsilon_caveat(False)}"
  return text


def _algorithms(args) -> list[str]:
  if not args.compare:
    return [args.algorithm]
  names = [n.strip() for n in args.compare.split(",") if n.strip()]
  unknown = [n for n in names if n not in _ALGORITHMS]
  if unknown or not names:
    raise ValueError(f"--compare {args.compare!r}: unknown algorithm(s) {unknown}; "
                     f"choose from {','.join(_ALGORITHMS)}")
  return list(dict.fromkeys(names))


def check_vocabulary_scale(args) -> None:
  """Refuses a ``--vocabulary-scale`` that is not > 0, or that no table of the run takes."""
  scale = args.vocabulary_scale
  if not scale > 0:
    raise ValueError(f"--vocabulary-scale must be > 0 (a multiple of Table 3's vocabularies), "
                     f"got {scale}")
  if scale != 1 and (args.vocabulary != "hashed" or args.reader == "batches"):
    raise ValueError(f"--vocabulary-scale {scale:g} sizes hashed tables, but this run's tables "
                     "are fixed by " + ("the sample's vocabulary (--reader batches)"
                                        if args.reader == "batches" else
                                        f"--vocabulary {args.vocabulary}")
                     + ": drop --vocabulary-scale or use --vocabulary hashed")


def check_memory(args, algorithms: list[str], settings) -> None:
  """Refuses, before any data is read or written, a run whose hashed tables and optimizer
  state alone exceed this machine's memory (:mod:`sparse_dp.jobs.train.memory`, a lower
  bound): the kernel would kill it part-way. Tables sized by the data (a vocabulary
  file, a sample's) and DP-FEST's top-k tables are not checked."""
  from sparse_dp.jobs.train import memory
  from sparse_dp.models import pctr_data
  if args.vocabulary != "hashed" or args.reader == "batches":
    return
  sizes = list(pctr_data.hashed_vocabulary(args.vocabulary_scale).sizes)
  limit = memory.memory_limit_bytes()
  for algorithm in algorithms:
    if Algorithm.parse(algorithm).uses_top_k_selection:
      continue
    needed = memory.bytes_needed(sizes, algorithm, settings.optimizer, settings.embedding_dim)
    if needed > limit:
      raise ValueError(
          f"--vocabulary-scale {args.vocabulary_scale:g} with --optimizer {settings.optimizer}: "
          f"{algorithm} needs at least "
          f"{memory.describe_needs(sizes, algorithm, settings.optimizer, settings.embedding_dim)}"
          f", more than this machine's {limit / memory.GIB:.1f} GiB: use --optimizer "
          "rowwise-adagrad or sgd (no table-sized optimizer state), or a smaller "
          "--vocabulary-scale or --embedding-dim")


def pctr_data_sizes(args) -> list[int]:
  """The hashed pCTR tables' rows: Table 3 times ``--vocabulary-scale``, of the first
  ``--categorical-features``."""
  from sparse_dp.models import pctr_data
  return list(pctr_data.hashed_vocabulary(args.vocabulary_scale).leading(
      args.categorical_features).sizes)


def _check_data_flags(args, settings) -> None:
  """Refuses, before ``--out`` is claimed (or cleared), a ``--data`` that matches no file
  and, where the training examples' number is known before the draw (synthetic data,
  ``--reader pandas``), a ``--batch-size`` above it."""
  if args.data != "synthetic" and args.reader != "batches" and "://" not in args.data:
    if not glob.glob(args.data):
      raise ValueError(f"--data {args.data!r} matches no file")
  elif args.data == "synthetic" and args.reader == "pandas":
    if args.max_examples == 0:
      raise ValueError("--data synthetic writes --max-examples lines: give a number >= 10")
    from sparse_dp.models.pctr_data import held_out_start
    job_flags.check_batch_fits(settings.batch_size, held_out_start(args.max_examples))


def _data_paths(args, out: pathlib.Path) -> tuple[list[pathlib.Path], float]:
  """The Criteo files to read and the scale of their tables relative to Table 3."""
  if args.data != "synthetic":
    paths = sorted(glob.glob(args.data))
    if not paths:
      raise ValueError(f"--data {args.data!r} matches no file")
    return [pathlib.Path(p) for p in paths], args.vocabulary_scale
  if args.max_examples == 0:
    raise ValueError("--data synthetic writes --max-examples lines: give a number >= 10")
  from sparse_dp.data import synthetic_cache
  synthetic = _synthetic(args)
  start = time.perf_counter()
  path, reused = synthetic_cache.write_day(synthetic, out / "synthetic_day_1.gz", 1,
                                           args.max_examples)
  print(f"sparse-dp train: {args.max_examples:,} synthetic examples "
        + (f"reused from {synthetic_cache.cache_dir()}" if reused
           else f"drawn in {time.perf_counter() - start:.0f} s (cached for the next run)"),
        flush=True)
  return [path], synthetic.scale


def _synthetic(args):
  """The synthetic dataset of ``--data synthetic``: its scale, seed and light users."""
  from sparse_dp.data.synthetic import SyntheticCriteo
  return SyntheticCriteo(scale=args.vocabulary_scale, seed=args.seed,
                         light_users=args.light_users)


def train(args: argparse.Namespace, algorithms: list[str]) -> list[dict]:
  """Runs the job for each algorithm; returns the metrics it also writes under ``--out``."""
  if args.max_examples < 0 or 0 < args.max_examples < 10:
    raise ValueError(f"--max-examples must be >= 10 (or 0: every line), got {args.max_examples}")
  job_flags.check_positive_flag("--epsilon", args.epsilon)
  private = [a for a in algorithms if Algorithm.parse(a).is_private]
  from sparse_dp.data import training_examples
  from sparse_dp.distribute import roles
  from sparse_dp.jobs.train import fitting, private_calibration

  check_vocabulary_scale(args)
  job_flags.check_light_users(args)
  job_flags.categorical_features(args)
  if args.calibration_share is not None:
    private_calibration.check_share(args.calibration_share)
  sample_job.resolve_defaults(args)
  settings = job_flags.fit_settings(args, epsilon=args.epsilon)
  fitting.check_hardware(settings, private)
  check_memory(args, algorithms, settings)
  if args.vocabulary == "hashed" and args.reader != "batches":  # else sized by the data
    job_flags.check_dense_tables(settings, private, pctr_data_sizes(args), args.fest_k)
  out = roles.output_folder(pathlib.Path(args.out))  # the chief's is --out
  secrets = training_examples.secrets_dir(args.secrets_dir)
  if args.reader == "pandas":  # before any work: the record's key stays out of --out
    training_examples.refuse_secrets_inside(secrets, out, "--out")
  _check_data_flags(args, settings)
  keep = ("workers",) if roles.is_chief() else ()
  claim_output_folder(out, args.overwrite, "sparse-dp train", keep)
  data = job_output.Phases("sparse-dp train")
  with data.phase("data"):
    train_inputs, held_out, vocabulary, skipped, recorded, settings = _inputs(
        args, algorithms, out, bool(private), settings)
  results = []
  for algorithm in algorithms:
    folder = out / algorithm if args.compare else out
    folder.mkdir(parents=True, exist_ok=True)
    print(f"sparse-dp train: {algorithm} on {_count(train_inputs):,} examples, "
          f"{len(held_out[1]):,} held out", flush=True)
    phases = job_output.Phases("sparse-dp train")
    phases.seconds.update(data.seconds)  # read once for every algorithm
    fit, preselection = fitting.train_and_evaluate(
        algorithm, settings, train_inputs, held_out, vocabulary.sizes, fest_k=args.fest_k,
        selection_share=args.selection_share,
        calibration_share=private_calibration.job_share(
            args.calibration_share, Algorithm.parse(algorithm).is_private, args.reader,
            args.strategy), phases=phases)
    metrics = {**fit.metrics, "vocabulary_scale": args.vocabulary_scale,
               "table_rows": sum(vocabulary.sizes), "skipped_lines": skipped,
               "noise_seed": args.noise_seed}
    with phases.phase("outputs"):
      _write_outputs(fit, metrics, preselection, vocabulary, folder, recorded, secrets)
    metrics["phase_seconds"] = {name: round(value, 2) for name, value in phases.seconds.items()}
    (folder / "metrics.json").write_text(json.dumps(metrics, indent=2))
    results.append(metrics)
  if args.compare:
    (out / "compare.json").write_text(json.dumps({"results": results}, indent=2))
    (out / "compare.md").write_text(_markdown_table(results) + "\n")
    _plot_comparison(results, out / "compare.png")
  record_outputs(out, "sparse-dp train", keep)
  return results


def _inputs(args, algorithms: list[str], out: pathlib.Path, private: bool, settings) -> tuple:
  """The job's training and held-out inputs: ``(train, held_out, vocabulary, skipped lines,
  the training examples held in memory (``--reader pandas``) or None, settings)``."""
  from sparse_dp.models import pctr_data
  recorded = None
  if args.reader == "batches":
    train_inputs, held_out, vocabulary, skipped = sample_job.sampled_inputs(
        args, algorithms, bool(private))
    settings = job_flags.fit_settings(args, epsilon=args.epsilon)  # the sample's B and steps
  elif args.reader == "tfdata":
    train_inputs, held_out, vocabulary, skipped = _streamed_inputs(args, out, bool(private))
  else:
    if args.max_examples < 10:
      raise ValueError(f"--max-examples must be >= 10 with --reader pandas, got "
                       f"{args.max_examples} (0, every line, needs --reader tfdata)")
    paths, table_scale = _data_paths(args, out)
    split = pctr_data.CriteoSplit.read(paths, args.max_examples, args.on_bad_line)
    vocabulary = pctr_data.job_vocabulary(args.vocabulary, split, bool(private), table_scale,
                                          args.min_count, args.categorical_features)
    train_inputs = pctr_data.model_inputs(split.train, vocabulary)
    held_out = pctr_data.model_inputs(split.held_out, vocabulary)
    skipped, recorded = split.skipped_lines, split.train
  return train_inputs, held_out, vocabulary, skipped, recorded, settings


def _write_outputs(fit, metrics: dict, preselection, vocabulary, folder: pathlib.Path, recorded,
                   secrets) -> None:
  """Writes one algorithm's model, vocabulary, record key, preselection and plots."""
  from sparse_dp.data import training_examples
  from sparse_dp.models import pctr
  pctr.save_model(fit.model, folder / "model")
  vocabulary.save(folder / "vocabulary.json")
  if recorded is not None:
    key = training_examples.save(recorded, folder, secrets)
    print(f"sparse-dp train: the key of the training examples' record is {key} (keep it "
          "out of what you release; 'distill --teacher' needs it)", flush=True)
  if preselection is not None:
    (folder / "preselection.json").write_text(json.dumps(
        {"epsilon": preselection.epsilon, "kept_buckets": preselection.kept_buckets}))
  _plot_training(fit.history, folder / "training.png")
  fit.reliability.plot(folder / "reliability.png", title=(
      f"{metrics['algorithm']}: held-out log-loss {metrics['logloss']:.3f}\n(base rate "
      f"{metrics['base_rate_logloss']:.3f}), ECE {metrics['ece']:.3f}"))


def _count(train_inputs) -> int:
  return getattr(train_inputs, "num_examples", None) or len(train_inputs[1])


def _streamed_inputs(args, out: pathlib.Path, private: bool):
  """``--reader tfdata``: the training files as a stream, the held-out files in memory."""
  from sparse_dp.models import pctr_data
  if args.vocabulary == "counted":
    raise ValueError("--reader tfdata does not count a vocabulary (that needs the data in "
                     "memory); use --vocabulary hashed or a vocabulary file")
  paths, table_scale = _data_paths(args, out)
  if args.eval_data:
    eval_paths = sorted(pathlib.Path(p) for p in glob.glob(args.eval_data))
    if not eval_paths:
      raise ValueError(f"--eval-data {args.eval_data!r} matches no file")
  elif args.data == "synthetic":
    from sparse_dp.data import synthetic_cache
    eval_paths = [synthetic_cache.write_day(
        _synthetic(args), out / "synthetic_day_2.gz",
        2, min(args.max_eval_examples, args.max_examples // 9 + 1))[0]]
  else:
    raise ValueError("--reader tfdata streams --data and evaluates on other files: give "
                     "--eval-data PATH_OR_GLOB (e.g. the last day)")
  vocabulary = pctr_data.job_vocabulary(args.vocabulary, None, private, table_scale, 1,
                                        args.categorical_features)
  train = pctr_data.StreamedExamples.open(paths, vocabulary, args.on_bad_line,
                                          args.max_examples or None)
  held_out = pctr_data.held_out_inputs(eval_paths, vocabulary, args.on_bad_line,
                                       args.max_eval_examples)
  return train, held_out, vocabulary, train.skipped_lines


_TABLE_COLUMNS = ("algorithm", "auc", "logloss", "base_rate_logloss", "ece", "epsilon",
                  "gradient_size_reduction", "nonzero_rows_per_step", "examples_per_second",
                  "examples_per_second_after_first_step", "steps")


def _markdown_table(results: list[dict]) -> str:
  def cell(value):
    if value is None:
      return "-"
    if isinstance(value, float):
      return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return str(value)
  lines = ["| " + " | ".join(_TABLE_COLUMNS) + " |", "|" + "---|" * len(_TABLE_COLUMNS)]
  lines += ["| " + " | ".join(_with_caveat(c, cell(r[c]), r) for c in _TABLE_COLUMNS) + " |"
            for r in results]
  return "\n".join(lines)


def _pyplot():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _plot_training(logs: dict, path: pathlib.Path) -> None:
  plt = _pyplot()
  names = [n for n in ("loss", "epsilon", "epsilon_not_poisson", "gradient_size_reduction")
           if n in logs]
  figure, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3), squeeze=False)
  for axis, name in zip(axes[0], names):
    axis.plot(range(1, len(logs[name]) + 1), logs[name], marker="o")
    axis.set_xlabel("epoch")
    axis.set_title(name)
  figure.tight_layout()
  figure.savefig(path)
  plt.close(figure)


def _plot_comparison(results: list[dict], path: pathlib.Path) -> None:
  plt = _pyplot()
  figure, axis = plt.subplots(figsize=(5, 3.5))
  for result in results:
    axis.scatter(result["gradient_size_reduction"], result["auc"], s=40)
    axis.annotate(result["algorithm"], (result["gradient_size_reduction"], result["auc"]),
                  textcoords="offset points", xytext=(5, 5))
  axis.set_xscale("log")
  axis.set_xlabel("gradient-size reduction (table rows / rows updated per step)")
  axis.set_ylabel("held-out AUC")
  epsilons = {r["epsilon"] and round(r["epsilon"], 3) for r in results} - {None}
  axis.set_title(f"epsilon = {', '.join(map(str, sorted(epsilons)))}" if epsilons else "")
  figure.tight_layout()
  figure.savefig(path)
  plt.close(figure)
