"""``sparse-dp train``'s parsed arguments for a dict of its flags, checked by its own parser.

What a study's point (:mod:`sparse_dp.jobs.study.runner.runs`) and a grid file
(:mod:`sparse_dp.jobs.study.runner.grid`) both turn into a run: the same parser as the
command, so a value the command refuses is refused here, naming the flag.
"""

from __future__ import annotations

import argparse
from typing import Any

from sparse_dp.jobs.train import job_flags, train_job


class _RefusingParser(argparse.ArgumentParser):
  """An argument parser that raises ``ValueError`` where argparse would exit."""

  def error(self, message):
    raise ValueError(message)


def _train_parser() -> argparse.ArgumentParser:
  commands = _RefusingParser(prog="sparse-dp").add_subparsers()
  train_job.add_parser(commands)
  return commands.choices["train"]


def train_arguments(flags: dict[str, Any]) -> argparse.Namespace:
  """``sparse-dp train``'s parsed arguments for ``flags`` (``{"tau_sigmas": 2, ...}``);
  a value the command refuses raises ``ValueError`` with its message."""
  argv = ["train"]
  for name, value in flags.items():
    option = "--" + name.replace("_", "-")
    if isinstance(value, bool):  # a switch: given or not
      argv += [option] if value else []
    else:
      argv += [option, ",".join(map(str, value)) if isinstance(value, (list, tuple))
               else str(value)]
  parser = _train_parser()
  args = parser.parse_args(argv[1:])
  job_flags.fit_settings(args, epsilon=args.epsilon)  # the settings' own checks
  return args
