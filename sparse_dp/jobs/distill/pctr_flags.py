"""Flags of the pCTR distillation methods (``dp-teacher``, ``rona``); no TensorFlow import.

The data, teacher-training (:func:`sparse_dp.jobs.train.job_flags.add_fit_flags`) and
student flags are shared by both methods and added once, with ``dp-teacher``'s.
"""

from __future__ import annotations

from sparse_dp.jobs.train import job_flags


def add_dp_teacher_arguments(group) -> None:
  """The shared pCTR flags, then ``dp-teacher``'s own."""
  _add_data_flags(group)
  job_flags.add_fit_flags(group)
  job_flags.add_categorical_features_flag(group)
  _add_student_flags(group)
  group.add_argument("--epsilon", type=float, default=1.0,
                     help="dp-teacher: the DP-AdaFEST teacher's epsilon (the student "
                          "inherits it); rona: the target the answers' noise is calibrated "
                          "to (unless --noise-multiplier)")
  group.add_argument("--teacher",
                     help="dp-teacher: a 'sparse-dp train' output folder (model/, "
                          "vocabulary.json, training_examples_keyed.npy) to distil instead "
                          "of training a teacher here; its epsilon is read from the model's "
                          "dp_record; --public-data examples whose features hash into its "
                          "keyed record of training examples are refused (by content, "
                          "whatever the path; the key from --secrets-dir); --data gives the "
                          "held-out examples")
  group.add_argument("--secrets-dir", metavar="DIR",
                     help="dp-teacher --teacher: the folder holding the key of the "
                          "teacher's record of training examples, which 'sparse-dp train' "
                          "wrote there (default $SPARSE_DP_SECRETS_DIR, else "
                          "~/.sparse_dp/keys)")
  group.add_argument("--skip-teacher-data-check", action="store_true",
                     help="dp-teacher --teacher without the key of its record: distil "
                          "without checking that --public-data holds none of the teacher's "
                          "training examples; the report says the check was skipped and "
                          "that the epsilon holds only if it holds none")
  group.add_argument("--features-are-public", action="store_true",
                     help="dp-teacher: declare that the features of the teacher's training "
                          "examples are public, so the student may be distilled on them "
                          "(--public-data sharing examples with the private data); the "
                          "epsilon then covers changing one label only, a replacement: "
                          "(2 epsilon, (1 + e^epsilon) delta) from the teacher's add/remove "
                          "(epsilon, delta), by group privacy")


def add_rona_arguments(group) -> None:
  """RONA's own flags (Wang et al., AAAI 2019, Algorithms 1-3); dp-teacher's give the rest."""
  group.add_argument("--query-share", type=float, default=0.2,
                     help="rona: query samples per epoch as a share of the public samples "
                          "(N_q = share x |x_p|; the paper's 20%%)")
  group.add_argument("--query-batch-size", type=int, default=512,
                     help="rona: S, public queries per teacher answer (one Gaussian "
                          "mechanism each)")
  group.add_argument("--hint-epochs", type=int, default=1, help="rona: T_h")
  group.add_argument("--rounds", type=int, default=2, help="rona: R")
  group.add_argument("--distill-epochs", type=int, default=1, help="rona: T_d per round")
  group.add_argument("--self-epochs", type=int, default=1, help="rona: T_s per round")
  group.add_argument("--self-batch-size", type=int, default=512, help="rona: S'")
  group.add_argument("--noise-multiplier", type=float,
                     help="rona: sigma; each answer gets N(0, (sigma C)^2) per coordinate "
                          "(default: the least sigma meeting --epsilon)")
  group.add_argument("--hint-clip", default="adaptive",
                     help="rona: C of the hints, per example (L2), or 'adaptive': the "
                          "mean hint norm of an auxiliary teacher trained on public data "
                          "on the same queries (RONA's adaptive norm bound)")
  group.add_argument("--logit-clip", default="adaptive",
                     help="rona: C of the logits, per example, or 'adaptive' (as "
                          "--hint-clip)")
  group.add_argument("--temperature", type=float, default=1.0,
                     help="rona: tau of the soft targets sigmoid(z / tau)")
  group.add_argument("--rona-delta", type=float, help="rona: delta (default 1/N private)")


def _add_data_flags(group) -> None:
  group.add_argument("--data", default="synthetic",
                     help="the teacher's private training data: 'synthetic' (day 1 of "
                          "SyntheticCriteo, --max-examples lines) or a path or glob of "
                          "Criteo files; the last 10%% are held out for evaluation")
  group.add_argument("--public-data", default="synthetic",
                     help="the distillation inputs: 'synthetic' (day --public-day of the "
                          "same SyntheticCriteo) or Criteo files the user may publish; "
                          "examples with the features of a teacher's training example are "
                          "refused (compared by content hash)")
  group.add_argument("--public-day", type=int, default=2,
                     help="day of --public-data synthetic (day 1 is the private data)")
  group.add_argument("--synthetic-scale", type=float, default=0.05,
                     help="SyntheticCriteo's vocabularies: Table 3's sizes times this")
  group.add_argument("--max-examples", type=int, default=40_000,
                     help="private examples read (written, for synthetic data)")
  group.add_argument("--max-public-examples", type=int, default=40_000,
                     help="public examples read (written, for synthetic data)")


def _add_student_flags(group) -> None:
  group.add_argument("--student-rows", type=float, default=0.1,
                     help="rows of each student table as a share of the teacher's (ids "
                          "hashed into them)")
  group.add_argument("--student-hidden-units", default="64,64",
                     help="widths of the student's ReLU layers")
  group.add_argument("--student-embedding-dim", type=int,
                     help="one embedding width for every student table (default: "
                          "int(2 rows^0.25) of each)")
  group.add_argument("--student-epochs", type=int, default=3,
                     help="dp-teacher: epochs over the distillation inputs")
  group.add_argument("--student-batch-size", type=int, default=512)
  group.add_argument("--student-learning-rate", type=float, default=3e-3)
  group.add_argument("--save", metavar="DIR",
                     help="write the student to DIR/student (SavedModel and vocabulary.json) "
                          "and, for dp-teacher, the DP teacher to DIR/teacher (a folder "
                          "--teacher reads); rona never writes its non-private teacher")
