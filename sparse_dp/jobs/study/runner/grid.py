"""A study's points from a grid file: ``sparse-dp study tradeoffs --grid FILE``.

FILE, YAML or JSON (JSON is YAML), maps flags of ``sparse-dp train`` to a value or a list of
values; the study trains every combination at every seed, each flag not given taking the
preset's value (then the command's default)::

    algorithm: [dpsgd, fest, adafest]
    tau_sigmas: [2, 4, 8]
    epsilon: 1
    seeds: 3             # seeds 0, 1, 2; or a list: [0, 5]

Values are checked by the command's parser, so a bad one is refused naming the flag; a flag
an algorithm does not read does not multiply its points. The grid sets the flags of one run
(:data:`RUN_FLAGS`); the data are the study's ``--data``. See docs/commands/study.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import pathlib
from typing import Any, Optional

from sparse_dp.accounting import Algorithm
from sparse_dp.jobs.study.presets import StudyPreset
from sparse_dp.jobs.study.runner.runs import Point
from sparse_dp.jobs.study.runner.train_arguments import train_arguments
from sparse_dp.jobs.train import job_flags


def _fit_flag_names() -> set[str]:
  parser = argparse.ArgumentParser()
  job_flags.add_fit_flags(parser)
  return set(vars(parser.parse_args([])))


# The flags of one run a grid may set: the algorithm, its epsilon and the training's
# flags, but not the data's (the study's --data) nor the seeds (the grid's `seeds`).
RUN_FLAGS = frozenset({"algorithm", "epsilon"} | _fit_flag_names()
                      - {"seed", "noise_seed", "on_bad_line"})
# Flags a Point holds as fields; the others ride in ``Point.flags``.
_POINT_FIELDS = ("algorithm", "epsilon", "fest_k", "tau_sigmas", "sigma_ratio")
# Flags only some algorithms read: a point of another algorithm leaves them out.
_READ_BY = {"tau": lambda kind: kind.uses_contribution_map,
            "contribution_clip": lambda kind: kind.uses_contribution_map,
            "dense_tables": lambda kind: kind.uses_contribution_map,
            "selection_share": lambda kind: kind.uses_top_k_selection}


@dataclasses.dataclass(frozen=True)
class Grid:
  """The points of a grid file, its seeds, its cap on the examples read and the
  number of synthetic examples drawn."""

  points: tuple[Point, ...]
  seeds: Optional[tuple[int, ...]]
  max_examples: Optional[int]
  examples: Optional[int] = None

  @classmethod
  def read(cls, path) -> "Grid":
    import yaml
    path = pathlib.Path(path)
    try:
      grid = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
      raise ValueError(f"--grid {str(path)!r}: not a readable YAML or JSON file ({error})")
    return cls.parse(grid, f"--grid {str(path)!r}")

  @classmethod
  def parse(cls, grid, where: str = "grid") -> "Grid":
    """The grid of a mapping ``{flag: value or [values]}`` (``where`` names it in errors)."""
    if not isinstance(grid, dict) or not grid:
      raise ValueError(f"{where}: give a mapping of `sparse-dp train` flags to values, "
                       f"e.g. {{algorithm: [dpsgd, adafest], tau_sigmas: [2, 4], seeds: 3}}")
    grid = {str(k).replace("-", "_"): v for k, v in grid.items()}
    seeds = _seeds(grid.pop("seeds", None), where)
    max_examples = _example_count(grid.pop("max_examples", None), "max_examples",
                                  "lines read of --data", where)
    examples = _example_count(grid.pop("examples", None), "examples",
                              "synthetic lines drawn per data seed", where)
    unknown = sorted(set(grid) - RUN_FLAGS)
    if unknown:
      raise ValueError(f"{where}: {', '.join(unknown)} not a flag a grid sets; give any of "
                       f"seeds, max_examples, examples, {', '.join(sorted(RUN_FLAGS))}")
    values = {name: v if isinstance(v, list) else [v] for name, v in grid.items()}
    for name, options in values.items():
      if not options:
        raise ValueError(f"{where}: {name} has no value")
      for value in options:
        try:
          train_arguments({name: value})
        except ValueError as error:
          raise ValueError(f"{where}: {name}: {value!r} refused ({error})") from None
    points = []
    for combination in itertools.product(*values.values()):
      flags = dict(zip(values, combination))
      try:
        args = train_arguments(flags)
      except ValueError as error:
        raise ValueError(f"{where}: {flags} refused ({error})") from None
      points.append(_point(args, flags))
    return cls(tuple(dict.fromkeys(points)), seeds, max_examples, examples)

  def preset(self, base: StudyPreset) -> StudyPreset:
    """``base`` with the grid's seeds, cap on the examples read and synthetic examples,
    where it gives them."""
    return dataclasses.replace(
        base, name=f"{base.name}+grid", seeds=self.seeds or base.seeds,
        max_examples=self.max_examples if self.max_examples is not None else base.max_examples,
        examples=self.examples if self.examples is not None else base.examples)


def _point(args: argparse.Namespace, flags: dict[str, Any]) -> Point:
  """The point of one combination; the fields its algorithm does not read are ``None``."""
  kind = Algorithm.parse(args.algorithm)
  return Point(
      kind.value, args.epsilon if kind.is_private else None,
      fest_k=args.fest_k if kind.uses_top_k_selection else None,
      tau_sigmas=(args.tau_sigmas if kind.uses_contribution_map and args.tau is None
                  else None),
      sigma_ratio=args.sigma_ratio if kind.uses_contribution_map else None,
      flags=tuple(sorted((name, value) for name, value in flags.items()
                         if name not in _POINT_FIELDS
                         and _READ_BY.get(name, lambda _: True)(kind))))


def _seeds(value, where: str) -> Optional[tuple[int, ...]]:
  if value is None:
    return None
  if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
    return tuple(range(value))
  if (isinstance(value, list) and value and len(set(value)) == len(value)
      and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in value)):
    return tuple(value)
  raise ValueError(f"{where}: seeds {value!r}: give a count >= 1 or a list of distinct "
                   "integers >= 0")


def _example_count(value, name: str, meaning: str, where: str) -> Optional[int]:
  if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 10):
    return value
  raise ValueError(f"{where}: {name} {value!r}: give one integer >= 10 ({meaning})")
