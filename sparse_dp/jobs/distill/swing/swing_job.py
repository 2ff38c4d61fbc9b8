"""``sparse-dp distill --method swing``: Li et al.'s (arXiv 2022) experiment on a next-item model.

As the paper's §4 does: the private data are split from the student's own data
(19:1 by default, §4.1); canaries go into the teacher's data only (§4.3); the
teacher is trained on them; then three students of one size learn on the
student data: alone (the paper's oracle "Student Model"), by plain KD, and by
Swing distillation (and, with ``--swing-ablations``, Swing without the dynamic
temperature and without the soft target protection, §4.5). The report gives
each model's top-1 / top-10 next-item accuracy on held-out data and its canary
exposure (:mod:`sparse_dp.jobs.distill.swing.metrics`), the parameter counts,
compression ratio, measured inference speed-up, and epsilon: ``null``, with the
reason (:data:`sparse_dp.jobs.distill.swing.temperature.NO_EPSILON_REASON`).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import tensorflow as tf

from sparse_dp.jobs.distill.distill_report import size_and_speed
from sparse_dp.jobs.distill.swing import metrics as swing_metrics
from sparse_dp.jobs.distill.swing.model import (
  NextItemModelSpec,
  TrainSettings,
  fit,
  predict_logits,
  predict_probabilities,
  teacher_targets,
)
from sparse_dp.jobs.distill.swing.swing_data import Canaries, MarkovItemChain
from sparse_dp.jobs.distill.swing.temperature import NO_EPSILON_REASON, SwingTargets

ACCURACY_METRIC = ("top-1 and top-10 next-item accuracy on held-out synthetic examples "
                   "(softmax at T = 1)")


def _check(args: argparse.Namespace) -> None:
  if not 0 <= args.swing_alpha <= 1:
    raise ValueError(f"--swing-alpha must be in [0, 1], got {args.swing_alpha}")
  if args.swing_top_k > args.swing_items:
    raise ValueError(f"--swing-top-k ({args.swing_top_k}) must be at most --swing-items "
                     f"({args.swing_items})")
  if not 0 <= args.swing_clue_items <= args.swing_items // 10:
    raise ValueError(f"--swing-clue-items must be in [0, --swing-items / 10 = "
                     f"{args.swing_items // 10}], got {args.swing_clue_items}")


def _specs(args: argparse.Namespace) -> tuple[NextItemModelSpec, NextItemModelSpec]:
  teacher = NextItemModelSpec(args.swing_items, args.swing_history, args.swing_teacher_dim,
                              args.swing_teacher_hidden)
  student = NextItemModelSpec(args.swing_items, args.swing_history, args.swing_student_dim,
                              args.swing_student_hidden, args.swing_student_buckets)
  if student.trainable_parameters() >= teacher.trainable_parameters():
    raise ValueError(
        f"the student ({student.trainable_parameters()} parameters) must be smaller than the "
        f"teacher ({teacher.trainable_parameters()}): lower --swing-student-dim, "
        "--swing-student-hidden or --swing-student-buckets")
  return teacher, student


def _student_methods(args: argparse.Namespace, clue_items: np.ndarray) -> dict:
  """The students' soft-target makers; ``None``: trained on its labels alone."""
  swing = SwingTargets(args.swing_temperature, args.swing_protection, args.swing_top_k,
                       args.swing_noise_scale, tuple(int(item) for item in clue_items))
  methods = {"student_alone": None, "kd": SwingTargets.plain_kd(args.swing_temperature),
             "swing": swing}
  if args.swing_ablations:
    methods["swing_without_dynamic_temperature"] = dataclasses.replace(swing, protection=0.0)
    methods["swing_without_target_protection"] = dataclasses.replace(swing, noise_scale=0.0)
  return methods


def _evaluate(model, test, canaries, batch_size: int) -> tuple[dict, np.ndarray]:
  """The model's report entry, and each canary's exposure (for paired differences)."""
  probabilities = predict_probabilities(
      model, np.concatenate([test.histories, canaries.histories]), batch_size)
  probabilities, canary_probabilities = probabilities[:len(test)], probabilities[len(test):]
  ranks, bits = swing_metrics.canary_exposures(canary_probabilities, canaries.secrets)
  return {"accuracy": {k: swing_metrics.top_k_accuracy(probabilities, test.next_items, n)
                       for k, n in (("top1", 1), ("top10", 10))},
          "canary_exposure": swing_metrics.exposure_summary(ranks, bits, canaries.clued)}, bits


def _add_exposure_differences(models: dict, bits: dict) -> None:
  """Each distilled student's per-canary exposure minus the student alone's (Table 1's delta)."""
  for name in models:
    if name not in ("teacher", "student_alone"):
      models[name]["exposure_above_student_alone"] = swing_metrics.paired_difference(
          bits[name], bits["student_alone"])


def run(args: argparse.Namespace) -> dict:
  began = time.perf_counter()
  _check(args)
  teacher_spec, student_spec = _specs(args)
  rng = np.random.default_rng(args.swing_seed)
  chain = MarkovItemChain.generate(args.swing_items, args.swing_branching, 1.0, rng)
  clue_items = chain.clue_items(args.swing_clue_items, rng)
  private = chain.sample(args.swing_teacher_examples, args.swing_history, rng)
  own = chain.sample(args.swing_student_examples, args.swing_history, rng)
  test = chain.sample(args.swing_test_examples, args.swing_history, rng)
  canaries = Canaries.generate(args.swing_canaries, args.swing_history, args.swing_items,
                               clue_items, rng)
  private = private.concatenate(canaries.repeated(args.swing_canary_repeats)).shuffled(rng)

  settings = lambda epochs, offset: TrainSettings(  # noqa: E731
      epochs, args.swing_batch_size, args.swing_learning_rate, args.swing_seed + offset)
  teacher = teacher_spec.build("teacher", args.swing_seed)
  fit(teacher, private.histories, private.next_items, settings(args.swing_teacher_epochs, 0))
  models, bits = {}, {}
  models["teacher"], bits["teacher"] = _evaluate(teacher, test, canaries, args.swing_batch_size)
  logits = predict_logits(teacher, own.histories, args.swing_batch_size)  # queried once
  students = {}
  for offset, (name, targets) in enumerate(_student_methods(args, clue_items).items(), 1):
    student = students[name] = student_spec.build(f"student_{name}", args.swing_seed + 100)
    soft = (None if targets is None else
            teacher_targets(logits, own.histories, targets, args.swing_batch_size,
                            args.swing_seed + offset))
    fit(student, own.histories, own.next_items, settings(args.swing_student_epochs, offset),
        soft, args.swing_temperature, 0.0 if soft is None else args.swing_alpha)
    models[name], bits[name] = _evaluate(student, test, canaries, args.swing_batch_size)
  _add_exposure_differences(models, bits)

  return {
      "model": (f"next-item softmax over {args.swing_items} items from the last "
                f"{args.swing_history} items (synthetic Markov chain, seed {args.swing_seed})"),
      **size_and_speed(teacher, students["swing"], tf.constant(test.histories),
                       args.swing_batch_size),
      "accuracy_metric": ACCURACY_METRIC,
      "teacher_accuracy": models["teacher"]["accuracy"],
      "student_accuracy": models["swing"]["accuracy"],
      "accuracy_loss_top1": (models["teacher"]["accuracy"]["top1"]
                             - models["swing"]["accuracy"]["top1"]),
      "bayes_accuracy": {"top1": chain.bayes_accuracy(test, 1),
                         "top10": chain.bayes_accuracy(test, 10)},
      "epsilon": None,
      "delta": None,
      "epsilon_reason": NO_EPSILON_REASON,
      "caveats": [f"no epsilon: {NO_EPSILON_REASON}",
                  f"the Laplace noise on the soft targets was drawn from --swing-seed "
                  f"({args.swing_seed}): reproducible, for experiments; it is only as secret "
                  "as that number"],
      "max_exposure": float(np.log2(args.swing_items)),
      "models": models,
      "swing": {"temperature": args.swing_temperature, "protection": args.swing_protection,
                "top_k": args.swing_top_k, "noise_scale": args.swing_noise_scale,
                "alpha": args.swing_alpha, "clue_items": len(clue_items),
                "temperature_formula": "T + protection / distance to the last clue item"},
      "data": {"teacher_examples": len(private), "student_examples": len(own),
               "test_examples": len(test), "canaries": len(canaries.secrets),
               "canary_repeats": args.swing_canary_repeats},
      "wall_seconds": time.perf_counter() - began,
  }
