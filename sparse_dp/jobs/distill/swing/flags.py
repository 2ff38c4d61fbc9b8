"""Flags of ``sparse-dp distill --method swing`` (no TensorFlow import: the parser stays fast).

Defaults follow Li et al. (arXiv 2022) where it gives a value: teacher and student data split
19:1 (§4.1), top-K = 3 (§4.6), the KD temperature T = 2 (App. B). Sizes are
chosen to run on a CPU in minutes.
"""

from __future__ import annotations

import argparse


def _positive_int(text: str) -> int:
  value = int(text)
  if value < 1:
    raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text}")
  return value


def _non_negative_float(text: str) -> float:
  value = float(text)
  if not value >= 0:
    raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
  return value


def add_swing_arguments(group) -> None:
  """Adds the ``--swing-*`` flags to ``group`` (an argparse group or parser)."""
  flag = lambda name, kind, default, help: group.add_argument(  # noqa: E731
      f"--swing-{name}", type=kind, default=default, help=f"{help} (default {default})")
  flag("items", _positive_int, 2000, "items in the synthetic catalogue (the softmax size)")
  flag("history", _positive_int, 4, "items of history the model sees")
  flag("branching", _positive_int, 8, "successors per item in the synthetic Markov chain")
  flag("teacher-examples", _positive_int, 76000, "private (teacher) examples, canaries excluded")
  flag("student-examples", _positive_int, 4000, "the student's own examples (distillation inputs)")
  flag("test-examples", _positive_int, 5000, "held-out examples for accuracy")
  flag("clue-items", int, 4, "privacy clue items (the paper's clue-word dictionary)")
  flag("canaries", _positive_int, 200, "canaries (half end in a clue item)")
  flag("canary-repeats", _positive_int, 10, "copies of each canary in the teacher's data")
  flag("teacher-dim", _positive_int, 64, "teacher embedding dimension")
  flag("teacher-hidden", _positive_int, 256, "teacher hidden units")
  flag("student-dim", _positive_int, 16, "student embedding dimension")
  flag("student-hidden", _positive_int, 64, "student hidden units")
  flag("student-buckets", _positive_int, 1000, "hash buckets of the student's input ids")
  flag("temperature", float, 2.0, "temperature coefficient T (also plain KD's temperature)")
  flag("protection", _non_negative_float, 10.0,
       "privacy protection coefficient beta of the dynamic temperature T + beta / distance")
  flag("top-k", _positive_int, 3, "K: soft targets that get Laplace noise")
  flag("noise-scale", _non_negative_float, 0.1, "Laplace scale b on the top-K soft targets")
  flag("alpha", float, 0.5, "weight of the distillation loss (Eq. 11)")
  flag("teacher-epochs", _positive_int, 8, "teacher training epochs")
  flag("student-epochs", _positive_int, 20, "student training epochs")
  flag("batch-size", _positive_int, 256, "training and inference batch size")
  flag("learning-rate", float, 3e-3, "Adam learning rate")
  flag("seed", int, 0, "seed of the data, canaries, initialisation and noise")
  group.add_argument("--swing-ablations", action="store_true",
                     help="also train the paper's ablations: Swing without the dynamic "
                          "temperature, and without the soft target protection (§4.5)")
