"""The ``sparse-dp`` command."""

from __future__ import annotations

import argparse
import re
import sys
from typing import Optional, Sequence

from sparse_dp.cli import privacy_command, tensorflow_logs
from sparse_dp.jobs.audit import audit_command
from sparse_dp.jobs.bench import select_rows_benchmark, step_time_benchmark
from sparse_dp.jobs.distill import distill_command
from sparse_dp.jobs.sample import sample_command
from sparse_dp.jobs.stream import stream_job
from sparse_dp.jobs.study import study_command
from sparse_dp.jobs.train import train_job


class _OneLineErrorParser(argparse.ArgumentParser):
  """Reports a bad flag in one line and exits 2."""

  def error(self, message: str):
    self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
  parser = _OneLineErrorParser(
      prog="sparse-dp",
      description="Differentially private training of large embedding models "
                  "without destroying gradient sparsity.")
  commands = parser.add_subparsers(dest="command", required=True,
                                   parser_class=_OneLineErrorParser)
  privacy_command.add_parser(commands)
  train_job.add_parser(commands)
  stream_job.add_parser(commands)
  sample_command.add_parser(commands)
  study_command.add_parser(commands)
  audit_command.add_parser(commands)
  distill_command.add_parser(commands)
  bench = commands.add_parser("bench", help="speed and memory benchmarks (JSON)")
  benchmarks = bench.add_subparsers(dest="benchmark", required=True,
                                    parser_class=_OneLineErrorParser)
  step_time_benchmark.add_parser(benchmarks)
  select_rows_benchmark.add_parser(benchmarks)
  _add_verbose(parser)
  return parser


def _add_verbose(parser: argparse.ArgumentParser, top: bool = True) -> None:
  """``--verbose`` on the command and every subcommand (before or after its name)."""
  parser.add_argument("--verbose", action="store_true",
                      default=False if top else argparse.SUPPRESS,
                      help="show TensorFlow's C++ start-up lines (CUDA, cuBLAS, TensorRT, CPU "
                           "features), hidden unless TF_CPP_MIN_LOG_LEVEL is set")
  for action in parser._subparsers._group_actions if parser._subparsers else []:
    for subcommand in action.choices.values():
      _add_verbose(subcommand, top=False)


def main(argv: Optional[Sequence[str]] = None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  if not args.verbose:
    tensorflow_logs.quiet_tensorflow_start_up()
  try:
    return args.run(args)
  except Exception as error:
    refusal = _refusal(error)
    if refusal is None:
      raise
    print(f"sparse-dp {args.command}: error: {refusal}", file=sys.stderr)
    return 2


def _refusal(error: Exception) -> Optional[str]:
  """The one line that refuses a bad input; ``None`` for any other error (a traceback).

  A ``ValueError`` or ``FileNotFoundError``, or one the package raised inside
  a TensorFlow input pipeline (a sample shard checked as it is read), which
  reaches ``fit`` as an ``OpError`` quoting it.
  """
  if isinstance(error, (ValueError, FileNotFoundError)):
    return str(error)
  tensorflow = sys.modules.get("tensorflow")
  if tensorflow is not None and isinstance(error, tensorflow.errors.OpError):
    quoted = re.search(r"(?:ValueError|FileNotFoundError): (sparse-dp: [^\n]*)", error.message)
    if quoted:
      return quoted.group(1)
  return None

