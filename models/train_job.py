"""``sparse-dp train``: train the Criteo pCTR model with a DP algorithm and report.

Reads Criteo files (or writes a synthetic Criteo day first, the default), holds
out the last 10% of examples for evaluation, builds the vocabulary on the rest,
trains with ``sparse_dp.make_private`` on Poisson-sampled batches, and reports
held-out AUC and log-loss with the epsilon spent. Writes to ``--out``: the
SavedModel, ``vocabulary.json``, ``metrics.json`` and ``training.png``.
"""

from __future__ import annotations

import argparse
import glob
import json
import pathlib
import time

_EVAL_SHARE = 0.1


def add_parser(commands) -> None:
  parser = commands.add_parser("train", help="train the Criteo pCTR model (main job)",
                               description=__doc__.splitlines()[0])
  parser.add_argument("--data", default="synthetic",
                      help="'synthetic' (default) or a path or glob of Criteo files")
  parser.add_argument("--algorithm", default="adafest", choices=["none", "dpsgd", "adafest"])
  parser.add_argument("--epsilon", type=float, default=1.0)
  parser.add_argument("--delta", type=float, help="default 1/N")
  parser.add_argument("--epochs", type=float, default=1.0)
  parser.add_argument("--batch-size", type=int, default=2048)
  parser.add_argument("--max-examples", type=int, default=60_000)
  parser.add_argument("--learning-rate", type=float, default=1e-3, help="Adam")
  parser.add_argument("--l2-norm-clip", type=float, default=1.0, help="C2")
  parser.add_argument("--contribution-clip", type=float, default=1.0, help="C1")
  parser.add_argument("--sigma-ratio", type=float, default=5.0, help="sigma1 / sigma2")
  parser.add_argument("--tau", type=float, default=5.0, help="AdaFEST threshold")
  parser.add_argument("--min-count", type=int, default=1, help="vocabulary frequency threshold")
  parser.add_argument("--on-bad-line", choices=["error", "skip"], default="error")
  parser.add_argument("--seed", type=int, default=0,
                      help="seed of the synthetic data and the initial weights")
  parser.add_argument("--noise-seed", type=int,
                      help="fix the DP noise for a reproducible experiment (never for a "
                           "release: the noise is only as secret as this number); "
                           "default: a secret seed from the OS")
  parser.add_argument("--out", default="sparse-dp-train", help="output folder")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  metrics = train(args)
  print(json.dumps(metrics) if args.json else "\n".join(f"{k}: {v}" for k, v in metrics.items()))
  return 0


def _data_paths(args, out: pathlib.Path) -> list[pathlib.Path]:
  if args.data != "synthetic":
    paths = sorted(glob.glob(args.data))
    if not paths:
      raise ValueError(f"--data {args.data!r} matches no file")
    return [pathlib.Path(p) for p in paths]
  from sparse_dp.data.synthetic import SyntheticCriteo  # pylint: disable=import-outside-toplevel
  return [SyntheticCriteo(seed=args.seed).write_day(out / "synthetic_day_1.gz", 1,
                                                    args.max_examples)]


def train(args: argparse.Namespace) -> dict:
  """Runs the job; returns the metrics it also writes to ``--out/metrics.json``."""
  if args.max_examples < 10:
    raise ValueError(f"--max-examples must be >= 10, got {args.max_examples}")
  import numpy as np  # pylint: disable=import-outside-toplevel
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  import sparse_dp  # pylint: disable=import-outside-toplevel
  from sparse_dp.data.criteo import CriteoReader, integer_features  # pylint: disable=import-outside-toplevel
  from sparse_dp.data.vocabulary import Vocabulary  # pylint: disable=import-outside-toplevel
  from sparse_dp.models.pctr import build_pctr_model  # pylint: disable=import-outside-toplevel

  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  reader = CriteoReader(_data_paths(args, out), on_bad_line=args.on_bad_line)
  frame = reader.read_all(args.max_examples)
  split = int(len(frame) * (1 - _EVAL_SHARE))
  train_frame, eval_frame = frame.iloc[:split], frame.iloc[split:]
  vocabulary = Vocabulary.build([train_frame], min_count=args.min_count)
  vocabulary.save(out / "vocabulary.json")

  def features(part):
    return {"integers": integer_features(part), "categorical": vocabulary.encode(part)}

  x_train, y_train = features(train_frame), train_frame["label"].to_numpy(np.float32)[:, None]
  x_eval, y_eval = features(eval_frame), eval_frame["label"].to_numpy(np.float32)[:, None]
  tf.keras.utils.set_random_seed(args.seed)
  model = build_pctr_model(vocabulary.sizes)
  model.compile(optimizer=tf.keras.optimizers.Adam(args.learning_rate),
                loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))
  config = sparse_dp.DPConfig(
      args.algorithm, l2_norm_clip=args.l2_norm_clip, contribution_clip=args.contribution_clip,
      threshold=args.tau, sigma_ratio=args.sigma_ratio, delta=args.delta,
      noise_seed=args.noise_seed,
      target_epsilon=None if args.algorithm == "none" else args.epsilon)
  batch = min(args.batch_size, len(train_frame))
  private = sparse_dp.make_private(model, config, num_examples=len(train_frame),
                                   batch_size=batch, epochs=args.epochs)
  start = time.perf_counter()
  if private.is_private:
    history = model.fit(private.poisson_dataset(x_train, y_train, epochs=args.epochs),
                        callbacks=[private.callback()], verbose=2)
  else:
    history = model.fit(x_train, y_train, batch_size=batch, epochs=max(1, round(args.epochs)),
                        verbose=2)
  seconds = time.perf_counter() - start
  logits = model.predict(x_eval, batch_size=8192, verbose=0)
  auc = tf.keras.metrics.AUC(from_logits=True)
  auc.update_state(y_eval, logits)
  logloss = float(tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(y_eval, logits)))
  logs = history.history
  steps = private.accountant.steps if private.is_private else len(logs["loss"]) * -(-split // batch)
  metrics = {
      "algorithm": args.algorithm, "auc": float(auc.result()), "logloss": logloss,
      "epsilon": private.epsilon() if private.is_private else None,
      "delta": private.delta if private.is_private else None,
      "steps": steps, "examples_per_second": steps * batch / seconds,
      "gradient_size_reduction": float(np.mean(logs.get("gradient_size_reduction", [1.0]))),
      "nonzero_rows_per_step": float(np.mean(logs["nonzero_rows"])) if "nonzero_rows" in logs
                               else None,
      "train_examples": len(train_frame), "eval_examples": len(eval_frame),
      "skipped_lines": reader.skipped_lines,
      "poisson_sampling": private.poisson_sampling,
  }
  model.save(out / "model")
  (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
  _plot(logs, out / "training.png")
  return metrics


def _plot(logs: dict, path: pathlib.Path) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  names = [n for n in ("loss", "epsilon", "gradient_size_reduction") if n in logs]
  figure, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3), squeeze=False)
  for axis, name in zip(axes[0], names):
    axis.plot(range(1, len(logs[name]) + 1), logs[name], marker="o")
    axis.set_xlabel("epoch")
    axis.set_title(name)
  figure.tight_layout()
  figure.savefig(path)
  plt.close(figure)
