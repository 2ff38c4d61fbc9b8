"""``sparse-dp distill --method {dp-teacher,rona,swing} ... --out FILE.json``.

Each method is one entry of :data:`METHODS`: its help line, a function adding its
flags to the parser and a function ``run(args) -> dict`` returning the report,
both named ``"module:function"`` and imported only when needed (the flags function
when the parser is built, so its module must not import TensorFlow at the top:
``sparse-dp --help`` stays fast). The command adds ``method`` and ``command`` to
the report, writes it as one JSON object to ``--out`` and prints it; the report's
``caveats`` (a list, every one kept) come right after ``method``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import pathlib
import shlex
from typing import Callable


@dataclasses.dataclass(frozen=True)
class Method:
  """One distillation method: ``add_arguments(parser)`` and ``run(args) -> dict``."""

  help: str
  add_arguments: str  # "module:function"; the module is imported to build the parser
  run: str  # "module:function"; imported when the method runs


METHODS: dict[str, Method] = {
    "dp-teacher": Method(
        "DP-AdaFEST teacher distilled on public/synthetic inputs (post-processing: the "
        "student inherits the teacher's epsilon; with --features-are-public, one label's "
        "replacement at (2 epsilon, (1 + e^epsilon) delta))",
        "sparse_dp.jobs.distill.pctr_flags:add_dp_teacher_arguments",
        "sparse_dp.jobs.distill.dp_teacher:run"),
    "rona": Method(
        "RONA (Wang et al., AAAI 2019): non-private teacher, clipped Gaussian-noised batch "
        "answers to selected public queries; hint, distillation and self learning",
        "sparse_dp.jobs.distill.pctr_flags:add_rona_arguments",
        "sparse_dp.jobs.distill.rona.rona_job:run"),
    "swing": Method(
        "Swing (Li et al., arXiv 2022): next-item softmax model; per-example dynamic "
        "temperature and Laplace noise on the top-K soft targets; canary exposure (no epsilon: "
        "not DP)",
        "sparse_dp.jobs.distill.swing.flags:add_swing_arguments",
        "sparse_dp.jobs.distill.swing.swing_job:run"),
}


def _resolve(name: str) -> Callable:
  module, function = name.split(":")
  return getattr(importlib.import_module(module), function)


def add_parser(commands) -> None:
  parser = commands.add_parser(
      "distill", help="private distillation into a compact student (JSON report)",
      description=__doc__.splitlines()[0] + "  Writes one JSON object: sizes, "
                  "compression ratio, speed-up, teacher and student quality, epsilon, and "
                  "every caveat (a list, at the top).")
  parser.add_argument("--method", required=True, choices=sorted(METHODS),
                      help="; ".join(f"{name}: {m.help}" for name, m in sorted(METHODS.items())))
  parser.add_argument("--out", required=True, help="the JSON report file")
  for name in sorted(METHODS):
    _resolve(METHODS[name].add_arguments)(
        parser.add_argument_group(f"--method {name}"))
  parser.set_defaults(run=run, distill_parser=parser)


def run(args: argparse.Namespace) -> int:
  out = pathlib.Path(args.out)
  if out.suffix != ".json":
    raise ValueError(f"--out must name a .json file, got {args.out!r}")
  fields = _resolve(METHODS[args.method].run)(args)
  # Every caveat at the top, a list (a method with none says so by an empty list).
  report = {"method": args.method, "caveats": fields.pop("caveats"), **fields}
  report["command"] = _command(args)
  out.parent.mkdir(parents=True, exist_ok=True)
  out.write_text(json.dumps(report, indent=2) + "\n")
  print(json.dumps(report))
  return 0


def _command(args: argparse.Namespace) -> str:
  """The command that repeats this run: the method, --out and every flag not at its default."""
  words = ["sparse-dp", "distill"]
  for action in args.distill_parser._actions:
    value = getattr(args, action.dest, None)
    if not action.option_strings or action.dest == "help" or (
        value == action.default and action.dest not in ("method", "out")):
      continue
    if isinstance(action, argparse._StoreTrueAction):
      words.append(action.option_strings[0])
    else:
      words += [action.option_strings[0], str(value)]
  return shlex.join(words)
