"""The pCTR distillation data: the teacher's private examples, held-out examples, public inputs.

The teacher trains on the first 90% of ``--data`` and both models are evaluated
on the last 10% (as ``sparse-dp train``). The student learns from ``--public-data``:
examples other than the teacher's training data. Inputs with the features of
the teacher's training examples (compared by content hash, keyed for a loaded
teacher, :mod:`sparse_dp.data.training_examples`) are refused (distilling on them is not
post-processing: the student would fit, and could give away, the private
examples' features), unless
the user declares their features public (``dp-teacher --features-are-public``);
then :attr:`DistillationData.saw_private_features` says so and the epsilon
covers only the labels (replacement of one label,
:func:`sparse_dp.jobs.distill.privacy_fields.label_replacement`). A loaded teacher's
check can be skipped (``--skip-teacher-data-check``, without the record's key): then
:attr:`DistillationData.private_examples_in_public` is ``None`` (unknown).
"""

from __future__ import annotations

import dataclasses
import glob
import pathlib
from typing import Optional

from sparse_dp.data import training_examples
from sparse_dp.data.criteo import CriteoReader
from sparse_dp.jobs.train import job_flags
from sparse_dp.models import pctr_data

_PRIVATE_DAY = 1
SKIPPED = ("skipped (--skip-teacher-data-check): --public-data was not compared with the "
           "teacher's training examples")


@dataclasses.dataclass(frozen=True)
class DistillationData:
  """Model inputs ``(features, labels)`` of each part, and where the public part came from."""

  private_train: tuple
  held_out: tuple
  public: tuple
  vocabulary: object  # sparse_dp.data.vocabulary.Vocabulary of the teacher's tables
  public_source: str
  # public examples with a private training example's features; None: not checked
  private_examples_in_public: Optional[int]
  teacher_data_check: str  # how --public-data was checked against the training examples

  @property
  def saw_private_features(self) -> Optional[bool]:
    """Whether the student saw private features; ``None``: unknown (the check was skipped)."""
    if self.private_examples_in_public is None:
      return None
    return self.private_examples_in_public > 0

  @property
  def vocabulary_sizes(self) -> list[int]:
    return self.vocabulary.sizes


def load(args, folder: pathlib.Path, vocabulary=None, features_are_public: bool = False,
         recorded: Optional[training_examples.Record] = None,
         skip_check: bool = False) -> DistillationData:
  """Reads (or writes, for synthetic data) the three parts into ``folder``.

  ``vocabulary``: the teacher's (a loaded teacher's); default: hashed into
  Table 3's sizes times the data's scale (data-independent). ``recorded``: the
  keyed hashes of the teacher's training examples (a loaded teacher's
  :class:`~sparse_dp.data.training_examples.Record`, with its key); default: those of
  the private training split read here. Public examples that hash into them are
  refused (unless ``features_are_public``), by content: a copy, a link or
  another path of the training data is refused like the same path.
  ``skip_check``: compare nothing (a loaded teacher whose key is not at hand).
  """
  features = job_flags.categorical_features(args)
  if vocabulary is not None and features is not None:
    raise ValueError("--categorical-features: a --teacher's vocabulary.json fixes its tables; "
                     "drop the flag")
  private_paths, scale = _paths(args, args.data, _PRIVATE_DAY, args.max_examples, folder)
  public_paths, _ = _paths(args, args.public_data, args.public_day, args.max_public_examples,
                           folder)
  split = pctr_data.CriteoSplit.read(private_paths, args.max_examples, args.on_bad_line)
  public = CriteoReader(public_paths, on_bad_line=args.on_bad_line).read_all(
      args.max_public_examples)
  if skip_check:
    shared, check = None, SKIPPED
  else:
    if recorded is None:
      recorded, where = training_examples.Record.of(split.train), "the first 90% of --data"
      check = "compared by content with the teacher's training examples (the first 90% of --data)"
    else:
      where = f"the keyed record of --teacher {args.teacher!r}"
      check = (f"compared by content with the teacher's training examples ({where}, "
               "read with its key)")
    shared = recorded.count_in(public)
  if shared and not features_are_public:
    raise ValueError(
        f"--public-data {args.public_data!r}: {shared:,} of its {len(public):,} examples have "
        f"the features of the teacher's private training examples ({where}; compared by "
        "content, whatever the file's name): a student distilled on them sees the private "
        "examples' features, which is not post-processing of the DP teacher and no epsilon "
        "here covers; give other (public) data, without those examples" +
        ("" if args.method == "rona" else ", or, if these features are public, "
                                          "--features-are-public (the epsilon then covers "
                                          "the labels only, by replacement)"))
  if vocabulary is None:
    vocabulary = pctr_data.hashed_vocabulary(scale).leading(features)
  return DistillationData(
      private_train=pctr_data.model_inputs(split.train, vocabulary),
      held_out=pctr_data.model_inputs(split.held_out, vocabulary),
      public=pctr_data.model_inputs(public, vocabulary),
      vocabulary=vocabulary,
      public_source=", ".join(map(str, public_paths)),
      private_examples_in_public=shared,
      teacher_data_check=check)


def _paths(args, data: str, day: int, max_examples: int,
           folder: pathlib.Path) -> tuple[list[pathlib.Path], float]:
  """The Criteo files of ``data`` and the scale of their tables relative to Table 3."""
  if max_examples < 10:
    raise ValueError(f"the distillation data needs >= 10 examples per part, got {max_examples} "
                     "(--max-examples / --max-public-examples)")
  if data != "synthetic":
    paths = sorted(pathlib.Path(p).resolve() for p in glob.glob(data))
    if not paths:
      raise ValueError(f"{data!r} matches no file (--data / --public-data)")
    return paths, 1.0
  from sparse_dp.data import synthetic_cache
  from sparse_dp.data.synthetic import SyntheticCriteo
  synthetic = SyntheticCriteo(scale=args.synthetic_scale, seed=args.seed)
  if not 0 <= day < synthetic.num_days:
    raise ValueError(f"--public-day must be in 0..{synthetic.num_days - 1}, got {day}")
  path = folder / f"synthetic_day_{day}_seed_{args.seed}.gz"
  if not path.exists():
    synthetic_cache.write_day(synthetic, path, day,
                              max(args.max_examples, args.max_public_examples))
  return [path.resolve()], synthetic.scale
