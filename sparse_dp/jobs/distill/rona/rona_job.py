"""``sparse-dp distill --method rona``: RONA (Wang et al., AAAI 2019), on the pCTR model.

A non-private teacher is trained on the private data; the compact student learns on public
data only (Algorithm 1): hint learning (``T_h`` epochs on ``N_q`` public queries: the student
up to its middle ReLU layer plus an adaptation layer fits the teacher's middle layer,
``L_hint = 1/2 ||r(g(x)) - z_h||^2``, eq. 3), then ``R`` rounds of self learning (``T_s``
epochs on the public labels, eq. 5; no privacy cost) and distillation (``T_d`` epochs on
``N_q`` queries chosen by Algorithm 3, :mod:`~sparse_dp.jobs.distill.rona.query_selection`,
fitting the teacher's ``sigmoid(z_t / tau)``, eq. 4). Every teacher answer goes through
:class:`~sparse_dp.jobs.distill.rona.answers.NoisyAnswers` in batches of ``S`` queries:
per-example clip ``C`` (fixed or RONA's adaptive bound), Gaussian noise ``sigma C``; the
epsilon is the PLD composition of one Gaussian mechanism per answered batch
(:mod:`~sparse_dp.jobs.distill.rona.privacy`). Departures from the paper: see
docs/commands/distill.md.
"""

from __future__ import annotations

import pathlib
import tempfile

import numpy as np
import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.jobs.distill import distill_report, pctr_inputs, privacy_fields, student
from sparse_dp.jobs.distill.rona import privacy as rona_privacy
from sparse_dp.jobs.distill.rona.answers import NoisyAnswers
from sparse_dp.jobs.distill.rona.privacy import RonaSchedule
from sparse_dp.jobs.distill.rona.query_selection import select_queries

NOT_COVERED = ("teacher_auc", "teacher_logloss", "auc_loss", "teacher_examples_per_second")


def run(args) -> dict:
  with tempfile.TemporaryDirectory() as folder:
    data = pctr_inputs.load(args, pathlib.Path(folder))
  x_public, y_public = data.public
  schedule = RonaSchedule.from_args(args, len(y_public))
  delta = args.rona_delta if args.rona_delta is not None else 1.0 / len(data.private_train[1])
  sigma = args.noise_multiplier if args.noise_multiplier is not None else (
      rona_privacy.calibrate_sigma(args.epsilon, delta, schedule.batch_size,
                                   schedule.answered_batches))
  teacher = _fit_pctr(args, data.private_train, data)
  auxiliary = _fit_pctr(args, data.public, data) if "adaptive" in (
      args.hint_clip, args.logit_clip) else None
  shape = student.StudentShape.from_args(args, data.vocabulary_sizes)
  keras.utils.set_random_seed(args.seed)
  model = shape.build(data.vocabulary_sizes)
  answers = NoisyAnswers(sigma, args.noise_seed)
  rng = np.random.default_rng([args.seed, 1])
  hint = _hint_models(teacher, auxiliary, model)
  for _ in range(args.hint_epochs):
    queries = rng.choice(len(y_public), schedule.queries_per_epoch, replace=False)
    _learn(hint["student"], x_public, queries, _answered(
        answers, hint["teacher"], hint["auxiliary"], x_public, queries, schedule, args.hint_clip),
        _half_squared_error, args, schedule.batch_size)
  for _ in range(args.rounds):
    student.fit(model, x_public, y_public, keras.losses.BinaryCrossentropy(from_logits=True),
                args, args.self_epochs, args.self_batch_size)
    for _ in range(args.distill_epochs):
      predicted = tf.sigmoid(student.logits(model, x_public)).numpy()
      queries = select_queries(predicted, schedule.queries_per_epoch, rng)
      _learn(model, x_public, queries, _answered(
          answers, teacher, auxiliary, x_public, queries, schedule, args.logit_clip),
          student.soft_target_loss(args.temperature), args, schedule.batch_size)
  if len(answers.batch_sizes) != schedule.answered_batches:
    raise AssertionError("RONA answered a different number of batches than it accounted")
  epsilon = rona_privacy.rona_epsilon(sigma, answers.batch_sizes, delta)
  saved = {"saved": {"student": student.save(model, data.vocabulary, f"{args.save}/student")}
           } if args.save else {}
  return {
      **saved,
      **distill_report.size_and_speed(teacher, model, data.held_out[0]),
      **student.quality_fields(teacher, model, data.held_out),
      "epsilon": epsilon, "delta": delta, "accountant": "pld",
      "caveats": privacy_fields.fixed_noise_seed(args.noise_seed, "the teacher's answers"),
      "epsilon_covers": _covers(schedule, sigma),
      "not_covered_by_epsilon": list(NOT_COVERED),
      "rona_claimed_epsilon": rona_privacy.rona_claimed_epsilon(sigma, answers.batch_sizes,
                                                                delta),
      "rona_claim": ("what RONA's argument would claim (sensitivity of a batch answer = its "
                     "clip bound C sqrt(S)); not a valid guarantee: one private example can "
                     "move every clipped answer by 2C, a sensitivity of 2 C sqrt(S)"),
      "answered_batches": len(answers.batch_sizes),
      "query_batch_size": schedule.batch_size,
      "queries_per_epoch": schedule.queries_per_epoch,
      "noise_multiplier": sigma,
      "answer_noise_multiplier": rona_privacy.answer_noise_multiplier(sigma,
                                                                      schedule.batch_size),
      "mean_clip": {"hint": float(np.mean(answers.clips[:schedule.hint_batches] or [0])),
                    "logit": float(np.mean(answers.clips[schedule.hint_batches:] or [0]))},
      "student": shape.to_dict(),
      "public_examples": int(len(y_public)), "public_source": data.public_source,
  }


def _fit_pctr(args, train, data) -> keras.Model:
  """A non-private pCTR model (the teacher, or the auxiliary teacher on public data)."""
  from sparse_dp.jobs.train import fitting, job_flags
  settings = job_flags.fit_settings(args, epsilon=args.epsilon)
  return fitting.fit_and_evaluate("none", settings, train, data.held_out,
                                  data.vocabulary_sizes, progress=False).model


def _middle(model: keras.Model) -> keras.layers.Layer:
  hidden = [layer for layer in model.layers if layer.name.startswith("hidden_")]
  return hidden[(len(hidden) - 1) // 2]


def _hint_models(teacher, auxiliary, model) -> dict:
  """Teacher hint layer, the auxiliary's, and the student to its guided layer + adaptation."""
  def hint(m):
    return None if m is None else keras.Model(m.inputs, _middle(m).output)
  teacher_hint = hint(teacher)
  adaptation = keras.layers.Dense(teacher_hint.output.shape[-1], name="adaptation")
  return {"teacher": teacher_hint, "auxiliary": hint(auxiliary),
          "student": keras.Model(model.inputs, adaptation(_middle(model).output))}


def _answered(answers: NoisyAnswers, teacher, auxiliary, features: dict, queries: np.ndarray,
              schedule, clip: str) -> np.ndarray:
  """The sanitized answers of ``teacher`` to ``queries``, one batch of S at a time."""
  out = []
  for start in range(0, len(queries), schedule.batch_size):
    batch = _rows(features, queries[start:start + schedule.batch_size])
    values = student.logits(teacher, batch)
    bound = (float(np.mean(np.linalg.norm(student.logits(auxiliary, batch), axis=1)))
             if clip == "adaptive" else float(clip))
    out.append(answers.answer(values, bound))
  return np.concatenate(out)


def _rows(features: dict, rows: np.ndarray) -> dict:
  """``features`` (a dict of arrays) at ``rows``."""
  return {name: values[rows] for name, values in features.items()}


def _learn(model, features, queries, targets, loss, args, batch_size) -> None:
  """One epoch over the answered queries, in the order they were answered."""
  student.fit(model, _rows(features, queries), targets, loss, args, 1, batch_size,
              shuffle=False)


def _half_squared_error(target, predicted):
  return 0.5 * tf.reduce_sum(tf.square(predicted - target), axis=-1)


def _covers(schedule, sigma: float) -> str:
  return (f"(epsilon, delta)-DP for adding or removing one example of the teacher's "
          f"private training data (the first 90% of --data): {schedule.answered_batches} "
          f"batch answers of {schedule.batch_size} public queries, each a Gaussian mechanism "
          f"with noise sigma C = {sigma:.6g} C per coordinate and L2 sensitivity 2 C sqrt(S) "
          "(the teacher is not private: one example can change every answer), composed by "
          "PLD, no amplification by sampling; covers the student's weights and its public "
          "inputs' selection. Not covered: the non-private teacher's held-out metrics "
          f"({', '.join(NOT_COVERED)}), reported for the operator who holds the teacher, and "
          "every held-out metric (the held-out 10% of --data is not protected)")
