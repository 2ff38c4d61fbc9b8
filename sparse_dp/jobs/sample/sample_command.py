"""``sparse-dp sample``: a Poisson sample of Criteo files into training batches, on Beam.

Runs :mod:`sparse_dp.jobs.sample.pipeline` on the DirectRunner (this machine) or,
with ``--runner``, on any Beam runner (DataflowRunner, FlinkRunner,
SparkRunner); options after ``--`` go to Beam's ``PipelineOptions`` as they
are. ``sparse-dp train --reader batches --data OUT --seed-file SEED`` trains on the
batches, one per step. The secret seed comes from ``--seed-file`` on every runner (only its
path travels in the pipeline); each run draws a fresh public salt, the ledger beside the
seed file (:mod:`sparse_dp.jobs.sample.sample_ledger`) refuses a salt drawn twice, and
``--reproduce FOLDER`` is the one way to draw a sample again. See docs/commands/sample.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import posixpath

from sparse_dp.jobs.job_output import progress_output

_PIPELINE_LOGGERS = ("apache_beam",)
# Flags of a new sample; a reproduction takes them from its manifest.
_NEEDED = ("data", "steps", "out")
_DEFAULTS = {"batch_size": 2048, "batches_per_shard": 64, "on_bad_line": "error"}
_FROM_THE_MANIFEST = (*_NEEDED, *_DEFAULTS, "num_examples", "max_batch_size")


def add_parser(commands) -> None:
  parser = commands.add_parser("sample", help="Poisson-sample Criteo files into batches (Beam)",
                               description=__doc__.splitlines()[0])
  parser.add_argument("--data", help="path or glob of Criteo files ('day_*')")
  parser.add_argument("--batch-size", type=int,
                      help="expected batch size B: q = B / N (default 2048)")
  parser.add_argument("--steps", type=int, help="batches T to draw")
  parser.add_argument("--out", help="a new or empty folder for the batches")
  parser.add_argument("--num-examples", type=int,
                      help="N, if known (skips the counting pass; checked against the files)")
  parser.add_argument("--max-batch-size", type=int,
                      help="truncate batches larger than this to a uniformly random subset "
                           "(accounted as truncated Poisson sampling)")
  parser.add_argument("--batches-per-shard", type=int,
                      help="batches per TFRecord file (default 64)")
  parser.add_argument("--seed-file", help="file holding the secret seed (>= 16 bytes; "
                                          "required), e.g. from /dev/urandom")
  parser.add_argument("--reproduce", metavar="FOLDER",
                      help="draw the sample in FOLDER again (same seed, same salt, from its "
                           "manifest) into FOLDER, e.g. to restore lost shards; its claims stay")
  parser.add_argument("--on-bad-line", choices=["error", "skip"], help="default: error")
  parser.add_argument("--runner", default="DirectRunner",
                      help="Beam runner (DirectRunner, DataflowRunner, FlinkRunner, ...)")
  parser.add_argument("--json", action="store_true", help="print one JSON object")
  parser.add_argument("beam_options", nargs="*", metavar="-- BEAM_OPTION",
                      help="after --: options for the runner, passed to Beam as they are")
  parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
  from apache_beam.io.filesystems import FileSystems
  from apache_beam.options.pipeline_options import PipelineOptions

  from sparse_dp.jobs.sample import pipeline
  from sparse_dp.jobs.sample.manifest import MANIFEST_NAME
  if args.seed_file is None:
    raise ValueError("--seed-file is required: every worker reads the secret seed from it "
                     "(only its path travels in the pipeline, never the key), training "
                     "checks the manifest with it, and the ledger beside it keeps samples "
                     "from repeating; write one with `head -c 32 /dev/urandom > SEED` and "
                     "keep it secret, away from the batches")
  if args.reproduce is not None:
    spec = _reproduction(args, FileSystems)
  else:
    spec = _new_sample(args, FileSystems)
  options = PipelineOptions(["--runner", args.runner, *args.beam_options])
  levels = {name: logging.getLogger(name).level for name in _PIPELINE_LOGGERS}
  with progress_output(args.json):
    print(f"sparse-dp sample: {len(spec.paths)} file(s) -> {spec.steps} batches of expected "
          f"size {spec.batch_size} in {spec.out} ({args.runner}"
          f"{', reproduced' if spec.reproduces else ''})", flush=True)
  try:
    for name in levels:  # a failed step's traceback: the error below says it in one line
      logging.getLogger(name).setLevel(logging.CRITICAL)
    pipeline.run(spec, args.seed_file, options)
  finally:
    for name, level in levels.items():
      logging.getLogger(name).setLevel(level)
  with FileSystems.open(posixpath.join(spec.out, MANIFEST_NAME)) as handle:
    manifest = json.loads(handle.read())
  summary = {k: manifest[k] for k in ("num_examples", "batch_size", "sampling_rate", "steps",
                                       "max_batch_size", "salt")}
  summary.update(shards=len(manifest["shards"]), out=spec.out, poisson_sampling=True)
  print(json.dumps(summary) if args.json else
        "\n".join(f"{key}: {value}" for key, value in summary.items()))
  return 0


def _new_sample(args: argparse.Namespace, filesystems):
  """The spec of a new sample, with a fresh salt recorded in the seed file's ledger."""
  from sparse_dp.jobs.sample import pipeline, sample_ledger
  from sparse_dp.jobs.sample.draws import new_salt
  missing = [_flag(name) for name in _NEEDED if getattr(args, name) is None]
  if missing:
    raise ValueError(f"{', '.join(missing)} needed: give the files, the number of batches and "
                     "a new folder (or --reproduce FOLDER to draw an existing sample again)")
  for name, value in _DEFAULTS.items():
    setattr(args, name, value if getattr(args, name) is None else getattr(args, name))
  paths = _input_paths(args.data, filesystems)
  _check_numbers(args)
  out = args.out.rstrip("/") or args.out
  _check_seed_file(args.seed_file, out)
  _check_out(out, filesystems)
  salt = new_salt()
  sample_ledger.record(args.seed_file, salt, out)
  return pipeline.SampleSpec(
      paths=tuple(paths), out=out, batch_size=args.batch_size, steps=args.steps, salt=salt,
      num_examples=args.num_examples, max_batch_size=args.max_batch_size,
      batches_per_shard=args.batches_per_shard, on_bad_line=args.on_bad_line)


def _reproduction(args: argparse.Namespace, filesystems):
  """The spec that draws the sample in ``--reproduce`` again, from its manifest."""
  from sparse_dp.jobs.sample import pipeline, sample_ledger
  from sparse_dp.jobs.sample.draws import SecretSeed
  from sparse_dp.jobs.sample.manifest import MANIFEST_NAME, Manifest
  given = [_flag(name) for name in _FROM_THE_MANIFEST if getattr(args, name) is not None]
  if given:
    raise ValueError(f"--reproduce takes the sample's files and numbers from its manifest: "
                     f"leave out {', '.join(given)}")
  folder = args.reproduce.rstrip("/") or args.reproduce
  _check_seed_file(args.seed_file, folder)
  path = posixpath.join(folder, MANIFEST_NAME)
  if not filesystems.exists(path):
    raise ValueError(f"--reproduce {folder!r} has no {MANIFEST_NAME}: give the --out folder "
                     "of a sample drawn with this --seed-file")
  with filesystems.open(path) as handle:
    manifest = Manifest.from_json(handle.read().decode(), path, SecretSeed.read(args.seed_file))
  sample_ledger.check_reproduction(args.seed_file, manifest.salt, folder)
  return pipeline.SampleSpec(
      paths=tuple(f["path"] for f in manifest.inputs), out=folder,
      batch_size=manifest.batch_size, steps=manifest.steps, salt=manifest.salt,
      num_examples=manifest.num_examples, max_batch_size=manifest.max_batch_size,
      batches_per_shard=len(manifest.shards[0].batch_sizes), on_bad_line=manifest.on_bad_line,
      reproduces=manifest)


def _flag(name: str) -> str:
  return "--" + name.replace("_", "-")


def _check_seed_file(seed_file: str, out: str) -> None:
  """Refuses a seed file inside the sample's folder, missing or too short (here, not on a
  worker)."""
  from sparse_dp.jobs.sample.draws import SecretSeed
  if _inside(seed_file, out):
    raise ValueError(f"--seed-file {seed_file!r} is inside {out!r}: the seed must never sit "
                     "beside the batches; keep it elsewhere")
  SecretSeed.read(seed_file)


def _input_paths(pattern: str, filesystems) -> list[str]:
  matched = filesystems.match([pattern])[0].metadata_list
  paths = sorted(m.path for m in matched if not m.path.endswith("/"))
  if not paths:
    raise ValueError(f"--data {pattern!r} matches no file: give a path or glob of Criteo "
                     "files, e.g. 'day_*'")
  names = [posixpath.basename(p) for p in paths]
  twice = sorted({n for n in names if names.count(n) > 1})
  if twice:
    raise ValueError(f"--data {pattern!r} matches files of the same name in different folders "
                     f"({', '.join(twice)}): an example is keyed by its file's name; give "
                     "files of distinct names")
  return paths


def _check_numbers(args) -> None:
  for flag, value, low in (("--batch-size", args.batch_size, 1), ("--steps", args.steps, 1),
                           ("--batches-per-shard", args.batches_per_shard, 1),
                           ("--max-batch-size", args.max_batch_size, 1),
                           ("--num-examples", args.num_examples, 2)):
    if value is not None and value < low:
      raise ValueError(f"{flag} must be an integer >= {low}, got {value}")
  if args.num_examples is not None and args.batch_size >= args.num_examples:
    raise ValueError(f"--batch-size {args.batch_size} >= --num-examples {args.num_examples}: "
                     "q = batch_size / N must be < 1; give a smaller batch size")


def _check_out(out: str, filesystems) -> None:
  if filesystems.exists(out) and filesystems.match([posixpath.join(out, "*")])[0].metadata_list:
    raise ValueError(f"--out {out!r} is not empty: give a new or empty folder (a sample is "
                     "never written over another)")


def _inside(path: str, folder: str) -> bool:
  path, folder = os.path.abspath(path), os.path.abspath(folder)
  return os.path.commonpath([path, folder]) == folder
