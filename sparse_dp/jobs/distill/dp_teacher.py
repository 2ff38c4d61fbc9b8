"""``sparse-dp distill --method dp-teacher``: a DP-AdaFEST teacher, a student by post-processing.

The teacher is trained here with DP-AdaFEST (:func:`sparse_dp.jobs.train.fitting.fit_and_evaluate`,
as ``sparse-dp train``) or loaded from a ``sparse-dp train`` folder. The student fits the
teacher's logits on public (or synthetic) inputs, so by post-processing (Dwork & Roth, Prop.
2.1) it is as private as the teacher: its epsilon is read from the teacher's ``dp_record``,
never recomputed from flags. Distilled on the teacher's own training examples
(``--features-are-public``), the student protects only their labels, at
``(2 epsilon, (1 + e^epsilon) delta)``
(:func:`~sparse_dp.jobs.distill.privacy_fields.label_replacement`). A loaded teacher's keyed
record of training examples is checked unless ``--skip-teacher-data-check``. See
docs/commands/distill.md (``dp-teacher``).
"""

from __future__ import annotations

import json
import pathlib
import tempfile
from typing import Optional

from sparse_dp._keras import keras
from sparse_dp.data import training_examples
from sparse_dp.jobs.distill import distill_report, pctr_inputs, privacy_fields, student
from sparse_dp.training.dp_state.provenance import refuse_undescribed
from sparse_dp.training.dp_state.state import attach

POST_PROCESSING = (
    "the student is post-processing of the DP teacher (it saw only the teacher and "
    "--public-data, none of whose examples has the features of a teacher's training example, "
    "compared by content hash): (epsilon, delta) is the teacher's, read from its dp_record, "
    "for adding or removing one private training example; it covers the student's weights "
    "and everything this report prints except the held-out AUC/log-loss of both models, "
    "computed on the held-out 10% of --data")
FEATURES_DECLARED_PUBLIC = (
    "NOT post-processing for the features: the student was distilled on {count:,} of the "
    "teacher's private training examples, whose features the user declared public "
    "(--features-are-public); (epsilon, delta) covers their labels only: datasets differing in "
    "one example's label, a replacement, which the teacher's add/remove (epsilon, delta) "
    "covers at (2 epsilon, (1 + e^epsilon) delta) by group privacy (teacher.epsilon and "
    "teacher.delta are the add/remove pair); the features are not protected and the student "
    "may reveal them")
POST_PROCESSING_UNCHECKED = (
    "only if --public-data holds none of the teacher's training examples (NOT checked: "
    "--skip-teacher-data-check), the student is post-processing of the DP teacher: (epsilon, "
    "delta) is then the teacher's, read from its dp_record, for adding or removing one "
    "private training example; it covers the student's weights and everything this report "
    "prints except the held-out AUC/log-loss of both models, computed on the held-out 10% of "
    "--data")
CHECK_SKIPPED = (
    "UNCHECKED: --public-data was not compared with the teacher's training examples "
    "(--skip-teacher-data-check, without the key of the teacher's record): the student is "
    "post-processing of the DP teacher, and (epsilon, delta) covers it, only if --public-data "
    "holds none of the teacher's training examples, which nothing here verified")


def teacher_privacy(teacher: keras.Model) -> dict:
  """Epsilon and delta of every DP run recorded in ``teacher``'s weights (its ``dp_record``),
  with ``caveats``, a list: steps not Poisson-sampled, un-noised statistics logged."""
  state = attach(teacher)
  record = state.record
  if not record.runs:
    raise ValueError("the teacher has no DP record: it was not trained by a private "
                     "algorithm; dp-teacher distils a DP teacher (train one with "
                     "'sparse-dp train --algorithm adafest', or use --method rona)")
  refuse_undescribed(teacher, state)  # its record must describe the weights distilled
  delta = max(run.delta for run in record.runs)
  caveats = []
  if record.non_poisson_steps:
    caveats.append(privacy_fields.not_poisson(record.non_poisson_steps, "the teacher"))
  if any(run.debug_metrics for run in record.runs):
    caveats.append("the teacher logged un-noised statistics of its private batches "
                   "(debug_metrics), which no epsilon covers")
  return {"epsilon": state.accountant().get_epsilon(delta), "delta": delta,
          "proved": not record.non_poisson_steps, "accountant": "pld",
          "teacher_runs": [run.algorithm for run in record.runs],
          "teacher_steps": record.steps_taken, "caveats": caveats}


def privacy_report(privacy: dict, private_examples_in_public: Optional[int]) -> dict:
  """The report's privacy fields from :func:`teacher_privacy`: the student's (epsilon,
  delta) for the adjacency it has (add/remove, or label replacement when it was distilled on
  private examples with public features), the teacher's, and every caveat.
  ``private_examples_in_public`` ``None``: not checked (the caveat :data:`CHECK_SKIPPED`,
  ``post_processing`` ``None``: unknown)."""
  privacy = dict(privacy)
  caveats, proved = privacy.pop("caveats"), privacy.pop("proved")
  if private_examples_in_public is None:
    caveats = [CHECK_SKIPPED] + caveats
  epsilon, delta = privacy.pop("epsilon"), privacy.pop("delta")
  teacher = {"adjacency": privacy_fields.ADD_REMOVE,
             **privacy_fields.epsilon_fields(epsilon, delta, proved), **privacy}
  if private_examples_in_public:
    epsilon, delta = privacy_fields.label_replacement(epsilon, delta)
    caveats = caveats + [
        f"NOT post-processing for the features: the student was distilled on "
        f"{private_examples_in_public:,} of the teacher's private training examples "
        "(--features-are-public); their features are not protected, and epsilon covers "
        "changing one label (epsilon_covers)"]
  if private_examples_in_public is None:
    covers, post_processing = POST_PROCESSING_UNCHECKED, None  # unknown: not checked
  elif private_examples_in_public:
    covers = FEATURES_DECLARED_PUBLIC.format(count=private_examples_in_public)
    post_processing = False
  else:
    covers, post_processing = POST_PROCESSING, True
  return {
      **privacy_fields.epsilon_fields(epsilon, delta, proved),
      "adjacency": (privacy_fields.LABEL_REPLACEMENT if private_examples_in_public
                    else privacy_fields.ADD_REMOVE),
      "epsilon_covers": covers,
      "post_processing": post_processing,
      "caveats": caveats, "teacher": teacher}


def run(args) -> dict:
  with tempfile.TemporaryDirectory() as folder:
    if args.teacher:
      if args.noise_seed is not None:
        raise ValueError("--noise-seed fixes the DP noise of a teacher trained here; a "
                         "--teacher's noise was drawn when it was trained (its metrics.json "
                         "says whether from a fixed seed): drop --noise-seed")
      if args.skip_teacher_data_check and args.features_are_public:
        raise ValueError(
            "--skip-teacher-data-check with --features-are-public: without the check the "
            "student's adjacency (label replacement for the teacher's training examples in "
            "--public-data) is unknown; give the record's key (--secrets-dir) or drop "
            "--features-are-public")
      teacher_folder = pathlib.Path(args.teacher)
      _check_teacher_folder(teacher_folder)
      recorded = (None if args.skip_teacher_data_check else training_examples.load(
          teacher_folder, training_examples.secrets_dir(args.secrets_dir)))
      teacher, vocabulary, noise_seed = _load_teacher(teacher_folder)
      data = pctr_inputs.load(args, pathlib.Path(folder), vocabulary, args.features_are_public,
                              recorded, skip_check=args.skip_teacher_data_check)
      trained = f"loaded from {args.teacher}"
    else:
      if args.skip_teacher_data_check:
        raise ValueError("--skip-teacher-data-check skips the check of a loaded --teacher's "
                         "record; a teacher trained here is checked against its own data: "
                         "drop the flag")
      data = pctr_inputs.load(args, pathlib.Path(folder),
                              features_are_public=args.features_are_public)
      teacher, noise_seed = _train_teacher(args, data), args.noise_seed
      trained = f"trained here with DP-AdaFEST on {len(data.private_train[1]):,} examples"
  privacy = privacy_report(teacher_privacy(teacher), data.private_examples_in_public)
  privacy["caveats"] += privacy_fields.fixed_noise_seed(noise_seed, "the teacher's training")
  privacy["teacher"]["trained"] = trained
  shape = student.StudentShape.from_args(args, data.vocabulary_sizes)
  keras.utils.set_random_seed(args.seed)
  model = shape.build(data.vocabulary_sizes)
  public_features = data.public[0]
  # Labels are the teacher's predictions; the public labels are never read.
  student.fit(model, public_features, student.logits(teacher, public_features),
              student.soft_target_loss(), args, args.student_epochs, args.student_batch_size)
  saved = {}
  if args.save:
    saved = {"saved": {"student": student.save(model, data.vocabulary, f"{args.save}/student"),
                       "teacher": student.save(teacher, data.vocabulary, f"{args.save}/teacher")}}
  return {
      **privacy,
      **saved,
      **distill_report.size_and_speed(teacher, model, data.held_out[0]),
      **student.quality_fields(teacher, model, data.held_out),
      "student": shape.to_dict(),
      "distillation_inputs": {"source": data.public_source,
                              "examples": int(len(data.public[1])),
                              "labels": "the teacher's logits (public labels unused)",
                              "private_training_examples": data.private_examples_in_public,
                              "saw_private_features": data.saw_private_features,
                              "teacher_data_check": data.teacher_data_check},
  }


def _train_teacher(args, data) -> keras.Model:
  from sparse_dp.jobs.train import fitting, job_flags
  settings = job_flags.fit_settings(args, epsilon=args.epsilon)
  return fitting.fit_and_evaluate("adafest", settings, data.private_train, data.held_out,
                                  data.vocabulary_sizes).model


def _check_teacher_folder(folder: pathlib.Path) -> None:
  """Refuses a folder that is not a ``sparse-dp train`` output of a teacher this job takes."""
  if not (folder / "model").is_dir() or not (folder / "vocabulary.json").is_file():
    raise ValueError(f"--teacher {str(folder)!r} is not a 'sparse-dp train' output folder "
                     "(model/ and vocabulary.json); give the --out of 'sparse-dp train'")
  if (folder / "preselection.json").is_file():
    raise ValueError(f"--teacher {str(folder)!r} was trained on preselected buckets (DP-FEST "
                     "/ DP-AdaFEST+), whose ids this command does not remap; give a dpsgd or "
                     "adafest teacher")


def _load_teacher(folder: pathlib.Path):
  """The model, its vocabulary and the noise seed it was trained with (``None``: secret)."""
  from sparse_dp.data.vocabulary import Vocabulary
  metrics = folder / "metrics.json"
  noise_seed = json.loads(metrics.read_text()).get("noise_seed") if metrics.is_file() else None
  return (keras.models.load_model(folder / "model"),
          Vocabulary.load(folder / "vocabulary.json"), noise_seed)
