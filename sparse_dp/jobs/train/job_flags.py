"""The training flags ``sparse-dp train`` and ``sparse-dp stream`` share, and their settings.

Kept free of TensorFlow imports so that ``sparse-dp --help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from typing import Optional

from sparse_dp.data.criteo_format import NUM_CATEGORICAL

# --optimizer: the Keras optimizer the job compiles (models.fitting.job_optimizer builds it).
OPTIMIZERS = ("adam", "lazy-adam", "adagrad", "rowwise-adagrad", "sgd")


@dataclasses.dataclass(frozen=True)
class FitSettings:
  """Hyper-parameters of one training run (``epsilon``: the training's own)."""

  epsilon: float = 1.0
  delta: Optional[float] = None
  epochs: float = 1.0
  batch_size: int = 2048
  learning_rate: float = 3e-3
  optimizer: str = "adam"  # one of OPTIMIZERS; learning_rate is its step size
  l2_norm_clip: float = 1.0
  contribution_clip: float = 1.0
  sigma_ratio: Optional[float] = None  # None: adafest_defaults' rule, 8 / tau_sigmas
  tau: Optional[float] = None
  tau_sigmas: Optional[float] = None  # None: adafest_defaults' rule
  dense_tables: "str | tuple[str, ...]" = ()  # DPConfig.dense_tables: "auto" or layer names
  hidden_units: Optional[tuple[int, ...]] = None  # None: the paper's (pctr.HIDDEN_UNITS)
  embedding_dim: Optional[int] = None  # None: the paper's int(2 V^0.25) per table
  seed: int = 0
  noise_seed: Optional[int] = None
  embedding: str = "auto"  # sparse_dp.layers.embedding_backends.BACKEND_NAMES
  strategy: str = "default"  # sparse_dp.distribute.local_cluster.STRATEGIES
  tpu: str = "local"  # the TPU of --strategy tpu (TPUClusterResolver)
  jit_compile: bool = False  # model.compile(jit_compile=True): the step compiled by XLA
  # Epsilon that earlier runs on the warm-started weights spent: their records
  # (``dp_record``) compose with this run's, so the run's budget includes them.
  earlier_epsilon: float = 0.0
  # Pure-DP epsilon of the top-k preselection made for this run (DP-FEST,
  # DP-AdaFEST+): charged in the model's record, so every epsilon logged includes it.
  selection_epsilon: float = 0.0


# The defaults of --sigma-ratio and --tau-sigmas before they followed the threshold rule
# (sparse_dp.accounting.adafest_defaults): what stream records and study caches hold.
DEFAULTS_BEFORE_RULE = {"sigma_ratio": 2.0, "tau_sigmas": 4.0}


def named_tables(vocabulary_sizes) -> list[tuple[str, int]]:
  """The pCTR model's tables as ``(layer name, rows)``: ``embedding_i`` holds the i-th."""
  return [(f"embedding_{i}", size) for i, size in enumerate(vocabulary_sizes)]


def add_fit_flags(parser: argparse.ArgumentParser) -> None:
  parser.add_argument("--delta", type=float, help="default 1/N")
  parser.add_argument("--epochs", type=float, default=1.0)
  parser.add_argument("--batch-size", type=int, default=2048)
  parser.add_argument("--learning-rate", type=float, default=3e-3,
                      help="the --optimizer's step size, for every optimizer (3e-3: Adam's best "
                           "of 1e-4..1e-2 for DP on the default data)")
  parser.add_argument("--optimizer", choices=OPTIMIZERS, default="adam",
                      help="adam (default; LazyAdam on the tables of a DP run), lazy-adam, "
                           "adagrad, rowwise-adagrad (one accumulator per table row: the "
                           "least optimizer memory for large tables) or sgd; docs/optimizers.md")
  parser.add_argument("--l2-norm-clip", type=float, default=1.0,
                      help="C2 (1: the best AUC on the default data; its clip biases the "
                           "predictions low, which --calibration-share corrects; 10 "
                           "calibrates too, at about 0.01 AUC: docs/calibration.md)")
  parser.add_argument("--contribution-clip", type=float, default=1.0, help="C1")
  parser.add_argument("--sigma-ratio", type=float,
                      help="AdaFEST sigma1 / sigma2 (default: 8 / the threshold in sigmas, 2.08 "
                           "on the default tables; docs/adafest_defaults.md)")
  parser.add_argument("--tau", type=float,
                      help="AdaFEST threshold (default: --tau-sigmas x sigma1 x C1)")
  parser.add_argument("--tau-sigmas", type=float,
                      help="threshold in units of the contribution map's noise (default: the "
                           "least that lets 1%% of --batch-size untouched rows through a step, "
                           "3.84 on the default tables; docs/adafest_defaults.md)")
  parser.add_argument("--dense-tables", default="none", metavar="none|auto|NAMES",
                      help="DP-AdaFEST: tables noised on every row as DP-SGD's, with no "
                           "selection: none (default), auto (every table of at most "
                           "--batch-size rows) or layer names such as embedding_0,embedding_5; "
                           "the epsilon is the same (docs/dense_tables.md)")
  parser.add_argument("--fest-k", type=int, default=300,
                      help="DP-FEST / DP-AdaFEST+: buckets kept per table")
  parser.add_argument("--selection-share", type=float, default=0.1,
                      help="DP-FEST / DP-AdaFEST+: share of epsilon spent on the top-k")
  parser.add_argument("--hidden-units", default="598,598,598,598",
                      help="widths of the ReLU layers (default: the paper's, App. D.1.1)")
  parser.add_argument("--embedding-dim", type=int,
                      help="one embedding dimension for every table (default: the paper's "
                           "int(2 V^0.25) for a table of V rows)")
  parser.add_argument("--on-bad-line", choices=["error", "skip"], default="error")
  parser.add_argument("--seed", type=int, default=0,
                      help="seed of the synthetic data and the initial weights")
  parser.add_argument("--noise-seed", type=int,
                      help="fix the DP noise for a reproducible experiment (never for a "
                           "release: the noise is only as secret as this number); "
                           "default: a secret seed from the OS")
  parser.add_argument("--embedding", choices=["auto", "tpu", "cpu", "engine-double"],
                      default="auto",
                      help="where the tables live: tpu (the TPU embedding engine, with "
                           "--strategy tpu: V1 on v2-v4, trained by a two-program loop; "
                           "SparseCore on v5p/v6e, TF 2.16+, trained by fit), cpu (Keras "
                           "variables: CPU, GPU or ordinary TPU variables), auto (tpu where the "
                           "hardware has an engine, else cpu; says which and why on stderr), "
                           "engine-double (testing: "
                           "the engine's update in pure TensorFlow off TPU); docs/tpu.md. "
                           "The metrics name the one used")
  parser.add_argument("--strategy", choices=["default", "mirrored", "multi-worker", "ps", "tpu"],
                      default="default",
                      help="tf.distribute strategy: multi-worker and ps join the cluster "
                           "TF_CONFIG names; ps without TF_CONFIG starts 2 parameter servers "
                           "and 2 workers on localhost (docs/clusters.md); "
                           "tpu: TPUStrategy on --tpu")
  parser.add_argument("--tpu", default="local",
                      help="--strategy tpu: the TPU, 'local' (this TPU VM's, default), a TPU "
                           "name or a grpc:// address")
  parser.add_argument("--jit-compile", action="store_true",
                      help="compile the train step with XLA, as on a TPU (model.compile("
                           "jit_compile=True)); the Poisson batches are padded to one size")


def add_categorical_features_flag(parser: argparse.ArgumentParser) -> None:
  """``--categorical-features K``: a pCTR model of the first K categorical features' tables."""
  parser.add_argument("--categorical-features", type=int, metavar="K",
                      help="train on the first K of the 26 categorical features, one table "
                           "each (default: all): fewer tables trace and train faster, for "
                           "trials and tests")


def add_light_users_flag(parser: argparse.ArgumentParser) -> None:
  """``--light-users S``: synthetic data whose first feature is a user id with light users."""
  parser.add_argument("--light-users", type=float, default=0.0, metavar="S",
                      help="--data synthetic: make the first feature a user id with a long "
                           "tail of light users, who give a share S of the examples (0: off, "
                           "the default; docs/dense_tables.md)")


def check_light_users(args: argparse.Namespace) -> None:
  """Refuses a ``--light-users`` out of ``[0, 1)``, or given with data files.

  Raises:
    ValueError: naming the flag and the fix.
  """
  if not 0 <= args.light_users < 1:
    raise ValueError(f"--light-users must be in [0, 1), got {args.light_users}")
  if args.light_users and args.data != "synthetic":
    raise ValueError("--light-users shapes the synthetic data: it needs --data synthetic")


def categorical_features(args: argparse.Namespace) -> Optional[int]:
  """The ``--categorical-features`` of ``args``, checked (None: all 26).

  Raises:
    ValueError: the count is not in ``1..26``, naming the flag.
  """
  count = args.categorical_features
  if count is not None and not 1 <= count <= NUM_CATEGORICAL:
    raise ValueError(f"--categorical-features must be in 1..{NUM_CATEGORICAL}, got {count}")
  return count


def check_positive_flag(flag: str, value: Optional[float]) -> None:
  """Refuses a ``flag`` whose ``value`` is not a finite number > 0 (``None``: not given).

  Raises:
    ValueError: naming the flag and the value given.
  """
  if value is not None and not (math.isfinite(value) and value > 0):
    raise ValueError(f"{flag} must be a finite number > 0, got {value}")


def check_fit_flags(args: argparse.Namespace) -> None:
  """Refuses, before any data is read or written, a fit flag out of its range.

  Raises:
    ValueError: the first flag out of range, named with the value given.
  """
  for flag in ("--epochs", "--l2-norm-clip", "--contribution-clip", "--sigma-ratio", "--tau",
               "--tau-sigmas"):
    check_positive_flag(flag, getattr(args, flag[2:].replace("-", "_")))
  if args.delta is not None and not 0 < args.delta < 1:
    raise ValueError(f"--delta must be in (0, 1) (default 1/N), got {args.delta}")
  for flag, value in (("--batch-size", args.batch_size), ("--fest-k", args.fest_k)):
    if value is not None and value < 1:
      raise ValueError(f"{flag} must be an integer >= 1, got {value}")
  dense_tables = dense_tables_flag(getattr(args, "dense_tables", "none"))
  tables = [f"embedding_{i}" for i in range(getattr(args, "categorical_features", None)
                                            or NUM_CATEGORICAL)]
  unknown = [name for name in dense_tables if name not in tables] if dense_tables != "auto" else []
  if unknown:
    raise ValueError(f"--dense-tables names {', '.join(unknown)}, not a table of the pCTR model: "
                     f"its tables are embedding_0 ... {tables[-1]}")


def check_batch_fits(batch_size: int, num_examples: int) -> None:
  """Refuses a ``--batch-size`` above the ``num_examples`` training examples.

  Raises:
    ValueError: naming both numbers and the fixes.
  """
  if batch_size > num_examples:
    raise ValueError(f"--batch-size {batch_size:,} is more than the {num_examples:,} training "
                     f"examples: give a --batch-size of at most {num_examples:,}, or more "
                     "examples (--max-examples)")


def fit_settings(args: argparse.Namespace, epsilon: float,
                 delta: Optional[float] = None) -> FitSettings:
  """The settings of ``args``, checked, with the training's own ``epsilon``."""
  check_fit_flags(args)
  if not 0 <= args.selection_share < 1:
    raise ValueError(f"--selection-share must be in [0, 1), got {args.selection_share}")
  if not args.learning_rate > 0:
    raise ValueError(f"--learning-rate must be > 0, got {args.learning_rate}")
  if args.embedding_dim is not None and args.embedding_dim < 1:
    raise ValueError(f"--embedding-dim must be a positive integer, got {args.embedding_dim}")
  hidden = layer_widths(args.hidden_units, "--hidden-units")
  return FitSettings(
      epsilon=epsilon, delta=args.delta if delta is None else delta, epochs=args.epochs,
      batch_size=args.batch_size, learning_rate=args.learning_rate, optimizer=args.optimizer,
      l2_norm_clip=args.l2_norm_clip, contribution_clip=args.contribution_clip,
      sigma_ratio=args.sigma_ratio, tau=args.tau, tau_sigmas=args.tau_sigmas,
      dense_tables=dense_tables_flag(getattr(args, "dense_tables", "none")),
      hidden_units=hidden, embedding_dim=args.embedding_dim, seed=args.seed,
      noise_seed=args.noise_seed, embedding=args.embedding,
      strategy=getattr(args, "strategy", "default"), tpu=getattr(args, "tpu", "local"),
      jit_compile=getattr(args, "jit_compile", False))


def dense_tables_flag(text: str) -> "str | tuple[str, ...]":
  """``--dense-tables``: ``"auto"``, or the layer names it lists (``none``: no table).

  Raises:
    ValueError: an empty name in the list, naming the flag.
  """
  if text in ("none", "auto"):
    return () if text == "none" else text
  names = tuple(name.strip() for name in text.split(","))
  if not all(names):
    raise ValueError(f"--dense-tables must be none, auto or layer names like "
                     f"embedding_0,embedding_5, got {text!r}")
  return names


def check_dense_tables(settings: FitSettings, algorithms, vocabulary_sizes, fest_k: int) -> None:
  """Refuses, before any data is read or a spend recorded, a ``--dense-tables`` that leaves a
  DP-AdaFEST or DP-AdaFEST+ run of the pCTR model no sparse table (``make_private`` would
  refuse it later). DP-AdaFEST+ trains on at most ``fest_k`` kept buckets and one
  out-of-vocabulary row per table.

  Args:
    settings: the run's settings (``dense_tables``, ``batch_size``).
    algorithms: the private algorithms the command trains.
    vocabulary_sizes: the pCTR tables' rows, ``embedding_0`` first.
    fest_k: ``--fest-k``.

  Raises:
    ValueError: the tables the flag makes dense are all of them, naming the fix.
  """
  if not settings.dense_tables:
    return
  from sparse_dp.accounting import Algorithm
  from sparse_dp.training.config import dense_table_names
  for algorithm in algorithms:
    kind = Algorithm.parse(algorithm)
    if kind.uses_contribution_map:
      kept = [min(size, fest_k + 1) if kind.uses_top_k_selection and size > fest_k else size
              for size in vocabulary_sizes]
      dense_table_names(settings.dense_tables, kind,
                        named_tables(kept),
                        settings.batch_size)


def layer_widths(text: str, flag: str) -> tuple[int, ...]:
  """``"598,598"`` as ``(598, 598)``; anything but positive integers is refused naming ``flag``."""
  try:
    widths = tuple(int(u) for u in text.split(","))
  except ValueError:
    widths = ()
  if not widths or min(widths) < 1:
    raise ValueError(f"{flag} must be positive integers like 598,598, got {text!r}")
  return widths
