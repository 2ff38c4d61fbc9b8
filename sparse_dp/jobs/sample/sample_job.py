"""``sparse-dp train --reader batches``: the flags and inputs of training on a Poisson sample.

The job trains on the batches of ``sparse-dp sample`` in step order, one batch
per step, and accounts them at the manifest's ``q = B / N`` (and truncation),
for the number of batches it actually trained on. Anything that would make that
epsilon wrong is refused: a ``--batch-size`` other than the sample's (``q``
would be another), more steps than the sample has unread batches (a batch used
twice is not a Poisson sample; batches an earlier run claimed are never read
again, :mod:`sparse_dp.jobs.sample.step_claims`), two models on one sample
(``--compare``), a manifest whose MAC is not the ``--seed-file``'s (edited, or
of another seed), a manifest that does not match its files, a missing shard,
DP-FEST's top-k (it counts the whole data, which the sample is not). Another
sample (``sparse-dp sample`` again, with the same seed file or not) has a fresh
salt and batches independent of this one's: what the refusals below suggest.
"""

from __future__ import annotations

import argparse
import glob
import pathlib

from sparse_dp.accounting import steps_for_epochs

# The train parser's defaults of the flags a sample fixes (None there: "not given").
DEFAULT_BATCH_SIZE = 2048
DEFAULT_EPOCHS = 1.0
_NOT_WITH_A_SAMPLE = ("fest", "adafest_plus")


def add_flags(parser: argparse.ArgumentParser) -> None:
  """``--seed-file``; ``--batch-size`` and ``--epochs`` default to "not given" (the
  sample's, or the usual)."""
  parser.add_argument("--seed-file", help="--reader batches: the seed file the sample was "
                                          "drawn with (checks its manifest)")
  parser.set_defaults(batch_size=None, epochs=None)


def resolve_defaults(args: argparse.Namespace) -> None:
  """The usual ``--batch-size`` and ``--epochs`` where not given, for the other readers."""
  if args.reader != "batches" and args.seed_file is not None:
    raise ValueError(f"--seed-file is for --reader batches (the seed of `sparse-dp sample`), "
                     f"not --reader {args.reader}: leave it out")
  if args.reader != "batches":
    args.batch_size = DEFAULT_BATCH_SIZE if args.batch_size is None else args.batch_size
    args.epochs = DEFAULT_EPOCHS if args.epochs is None else args.epochs


def sampled_inputs(args: argparse.Namespace, algorithms: list[str], private: bool):
  """``(batches, held_out, vocabulary, skipped_lines)``; sets ``args.batch_size``/``epochs``.

  ``args.epochs`` becomes ``steps * q`` (so the job's ``ceil(epochs / q)`` is
  ``steps``): every batch no earlier run claimed by default, or the next
  ``ceil(E / q)`` for ``--epochs E``, refused beyond them.
  """
  from sparse_dp.jobs.sample.batches import SampledBatches
  from sparse_dp.jobs.sample.draws import SecretSeed
  from sparse_dp.jobs.sample.step_claims import CLAIMS
  from sparse_dp.models import pctr_data
  if len(algorithms) > 1:
    raise ValueError(f"--reader batches trains one model per sample, not {len(algorithms)} "
                     "(--compare): models trained on the same batches together lose the "
                     "sample's amplification; sample once per algorithm (one seed file can "
                     "serve all: each sample has its own salt) and train each on its own sample")
  refused = [a for a in algorithms if a in _NOT_WITH_A_SAMPLE]
  if refused:
    raise ValueError(f"--reader batches cannot train {', '.join(refused)}: their top-k "
                     "preselection counts the whole training data, not a sample; use "
                     "dpsgd or adafest")
  if args.vocabulary == "counted":
    raise ValueError("--reader batches does not count a vocabulary (that needs the whole "
                     "data); use --vocabulary hashed or a vocabulary file")
  if args.seed_file is None:
    raise ValueError("--reader batches needs --seed-file, the seed file the sample was drawn "
                     "with: it checks the manifest's MAC (the sample's N and q as written, "
                     "never edited)")
  if not args.eval_data:
    raise ValueError("--reader batches trains on the sample at --data and evaluates on other "
                     "files: give --eval-data PATH_OR_GLOB (e.g. the last day)")
  eval_paths = sorted(pathlib.Path(p) for p in glob.glob(args.eval_data))
  if not eval_paths:
    raise ValueError(f"--eval-data {args.eval_data!r} matches no file")
  vocabulary = pctr_data.job_vocabulary(args.vocabulary, None, private, 1.0, 1,
                                        args.categorical_features)
  batches = SampledBatches.open(args.data, vocabulary, SecretSeed.read(args.seed_file))
  manifest = batches.manifest
  if args.batch_size is not None and args.batch_size != manifest.batch_size:
    raise ValueError(f"--batch-size {args.batch_size} contradicts the sample's batch size "
                     f"{manifest.batch_size} (q = {manifest.sampling_rate:.4g}): leave "
                     "--batch-size out, or sample again with the batch size you want")
  unread = steps = batches.batches_left
  if not unread:
    raise ValueError(f"--data {args.data!r}: all {manifest.steps:,} batches of the sample were "
                     f"claimed by earlier runs ({CLAIMS}/ in the sample folder); a "
                     "batch used twice is not a Poisson sample: sample again with `sparse-dp "
                     "sample` (a fresh salt: new batches, also with the same seed file)")
  if args.epochs is not None:
    steps = steps_for_epochs(args.epochs, manifest.sampling_rate)
    if steps > unread:
      raise ValueError(
          f"--epochs {args.epochs:g} needs {steps:,} steps, but the sample has "
          f"{unread:,} unread batches of {manifest.steps:,} "
          f"({manifest.steps - unread:,} claimed by earlier runs): a second pass over the "
          "same batches is not a "
          "Poisson sample: leave --epochs out (every unread batch) or sample again with "
          "`sparse-dp sample --steps` (a fresh salt: new batches, also with the same seed "
          "file)")
  args.batch_size, args.epochs = manifest.batch_size, steps * manifest.sampling_rate
  held_out = pctr_data.held_out_inputs(eval_paths, vocabulary, args.on_bad_line,
                                       args.max_eval_examples)
  return batches, held_out, vocabulary, sum(f["skipped_lines"] for f in manifest.inputs)
