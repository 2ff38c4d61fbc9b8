"""What a model's private training spent, as plain numbers any Keras format keeps.

A :class:`Record` is the history of the DP runs that trained some weights: each
``make_private`` run's mechanism (:class:`Run`) and the steps it took. It is written into an
``int64`` vector weight ``dp_record`` of the layers that hold the trained weights
(:func:`sparse_dp.layers.embedding.add_dp_record`), so every Keras format carries it. Layout:
``[steps_taken, non_poisson_steps, datasets_made, json_bytes, json...]``, three counters (the
DP step adds to the first two in the graph), then the runs as UTF-8 JSON packed eight bytes
to a word (zeros: no record); the last ``BINDING_WORDS`` bind the record to the weights it
describes (:class:`Binding`). Records merge by run: a run present
in several records counts the most steps any of them saw, runs of different histories are
all composed. See
docs/epsilon.md ("The DP state and the weight fingerprint").
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from typing import Iterable, Mapping, Optional

import numpy as np

from sparse_dp.accounting import Truncation
from sparse_dp.layers.embedding import DP_RECORD_WORDS

_HEADER = 4  # steps_taken, non_poisson_steps, datasets_made, the JSON's length in bytes
BINDING_WORDS = 16  # the last words: mark, model's and layer's fingerprints, variable indices
_CAPACITY = (DP_RECORD_WORDS - _HEADER - BINDING_WORDS) * 8  # bytes of JSON a record holds
BINDING_START = DP_RECORD_WORDS - BINDING_WORDS
MODEL_WORD, LAYER_WORD = BINDING_START + 1, BINDING_START + 2  # float64 bits of each
_INDICES = BINDING_START + 4
MAX_LAYER_VARIABLES = DP_RECORD_WORDS - _INDICES
_MARK = 0x5D9F_1B6E_0A3C_7E41  # the record is bound to weights


@dataclasses.dataclass(frozen=True)
class Binding:
  """The weights a record describes, by their fingerprints
  (:mod:`sparse_dp.training.dp_state.weight_fingerprint`).

  Attributes:
    model: ``s(w)`` of every weight of the model that wrote the record.
    layer: the part of ``model`` from the variables of the layer that holds the record.
    indices: those variables' places in that model's fingerprint.
  """

  model: float
  layer: float
  indices: tuple[int, ...]

  def words(self) -> np.ndarray:
    """The binding as the last ``BINDING_WORDS`` of a ``dp_record`` weight."""
    if len(self.indices) > MAX_LAYER_VARIABLES:
      raise ValueError(f"sparse-dp: a layer holding a DP record has {len(self.indices)} "
                       f"trainable variables; at most {MAX_LAYER_VARIABLES} are bound")
    words = np.zeros(BINDING_WORDS, np.int64)
    words[:4] = (_MARK, _bits(self.model), _bits(self.layer), len(self.indices))
    words[4:4 + len(self.indices)] = self.indices
    return words


@dataclasses.dataclass(frozen=True)
class Run:
  """One ``make_private`` run: what each of its steps costs.

  Attributes:
    algorithm: the algorithm's name (``dpsgd``, ``fest``, ``adafest``, ``adafest+``).
    noise_multiplier: that of the one Gaussian each step amounts to.
    sampling_rate: ``q = B / N``.
    first_step: the model's step count when the run began.
    num_examples: ``N``.
    delta: the run's target delta.
    selection_epsilon: pure-DP epsilon of the top-k preselection, spent once at the
      start of the run.
    statistics_epsilon: pure-DP epsilon of the preprocessing statistics, spent once too.
    epsilon_budget: the epsilon training stops at, or ``None``.
    debug_metrics: whether un-noised statistics were logged.
    run_id: a random identifier, by which records of the same run merge.
    max_batch_size: batches were truncated to this size; ``None``: not truncated.
  """

  algorithm: str
  noise_multiplier: float  # of the one Gaussian each step amounts to
  sampling_rate: float
  first_step: int
  num_examples: int
  delta: float
  selection_epsilon: float = 0.0  # pure DP, spent once at the start of the run
  statistics_epsilon: float = 0.0  # pure DP of its preprocessing statistics, spent once too
  epsilon_budget: Optional[float] = None
  debug_metrics: bool = False
  run_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)
  max_batch_size: Optional[int] = None  # batches truncated to this size (None: not truncated)

  @property
  def truncation(self) -> Optional[Truncation]:
    """How the run's batches were truncated, for the accountant (``None``: they were not)."""
    return (None if self.max_batch_size is None
            else Truncation(self.num_examples, self.max_batch_size))

  def continued_by(self, other: "Run") -> bool:
    """Whether ``other`` trains as this run did (same mechanism, rate and selection).

    Args:
      other: a later run on the same weights.

    Returns:
      True when the algorithm, noise multiplier, sampling rate, selection epsilon and
        truncation are the same: ``other`` is this job going on.
    """
    return ((self.algorithm, self.noise_multiplier, self.sampling_rate, self.selection_epsilon,
             self.max_batch_size)
            == (other.algorithm, other.noise_multiplier, other.sampling_rate,
                other.selection_epsilon, other.max_batch_size))


@dataclasses.dataclass(frozen=True)
class Record:
  """Runs in the order they began, and the counters over all of them.

  Run ``i`` took ``first_step[i + 1] - first_step[i]`` steps (the last one
  ``steps_taken - first_step``). A run recorded twice (re-recorded after a
  restore replaced the record) took the sum of its entries' steps.
  """

  runs: tuple[Run, ...] = ()
  steps_taken: int = 0
  non_poisson_steps: int = 0
  datasets_made: int = 0

  @property
  def empty(self) -> bool:
    return not self.runs and self.steps_taken == 0

  def steps_by_run(self) -> dict[str, int]:
    """Steps each run took, by ``run_id``, in the order the runs began."""
    ends = [run.first_step for run in self.runs[1:]] + [self.steps_taken]
    steps: dict[str, int] = {}
    for run, end in zip(self.runs, ends):
      steps[run.run_id] = steps.get(run.run_id, 0) + end - run.first_step
    return steps

  def runs_by_id(self) -> dict[str, Run]:
    """Each run's first entry, by ``run_id``."""
    runs: dict[str, Run] = {}
    for run in self.runs:
      runs.setdefault(run.run_id, run)
    return runs

  def runs_json(self) -> str:
    return json.dumps([dataclasses.asdict(run) for run in self.runs])

  @classmethod
  def from_json(cls, runs_json: str, steps_taken: int, non_poisson_steps: int,
                datasets_made: int) -> "Record":
    return cls(tuple(Run(**run) for run in json.loads(runs_json)), steps_taken,
               non_poisson_steps, datasets_made)


def merge(records: Iterable[Record], floor: Optional[Mapping[str, int]] = None) -> Record:
  """One record of every run in ``records``, each with the most steps seen.

  A run's steps are the most any record shows, and at least ``floor[run_id]``
  (steps known to have run, e.g. in this process before a rollback). Runs are
  ordered by where they last appear (give the live record last, so the run the
  DP step counts for stays last). ``non_poisson_steps`` is the largest (any
  non-Poisson step shows); ``datasets_made`` the sum over distinct records, so
  no sample stream a history used is keyed again.
  """
  distinct = list(dict.fromkeys(r for r in records if not r.empty))
  floor = floor or {}
  steps: dict[str, int] = {}
  for record in distinct:
    for run_id, taken in record.steps_by_run().items():
      steps[run_id] = max(steps.get(run_id, 0), taken, floor.get(run_id, 0))
  if len(distinct) == 1 and steps == distinct[0].steps_by_run():
    return distinct[0]
  runs = {run.run_id: run for record in distinct for run in record.runs}
  order = list(reversed(dict.fromkeys(
      run.run_id for record in reversed(distinct) for run in reversed(record.runs))))
  ordered, first_step = [], 0
  for run_id in order:
    ordered.append(dataclasses.replace(runs[run_id], first_step=first_step))
    first_step += steps[run_id]
  return Record(tuple(ordered), first_step,
                max((r.non_poisson_steps for r in distinct), default=0),
                sum(r.datasets_made for r in distinct))


def encode(record: Record, binding: Optional[Binding] = None) -> np.ndarray:
  """``record`` as the ``int64`` words of a ``dp_record`` weight.

  Args:
    record: the runs and counters.
    binding: the weights the record describes; ``None``: not bound.

  Returns:
    ``DP_RECORD_WORDS`` int64 words.
  """
  payload = record.runs_json().encode() if record.runs else b""
  if len(payload) > _CAPACITY:
    raise ValueError(
        f"sparse-dp: the DP record of these weights is full ({len(record.runs)} runs, "
        f"{_CAPACITY} bytes): continue an existing run (make_private with the same config "
        "and resume_from=...) rather than starting a new run per period")
  words = np.zeros(DP_RECORD_WORDS, np.int64)
  words[:_HEADER] = (record.steps_taken, record.non_poisson_steps, record.datasets_made,
                     len(payload))
  padded = payload + b"\0" * (-len(payload) % 8)
  words[_HEADER:_HEADER + len(padded) // 8] = np.frombuffer(padded, "<i8")
  if binding is not None:
    words[BINDING_START:] = binding.words()
  return words


def decode_binding(words: np.ndarray) -> Optional[Binding]:
  """The :class:`Binding` of a ``dp_record`` weight's record; ``None`` if it is not bound."""
  words = np.asarray(words, np.int64)[BINDING_START:]
  if words[0] != _MARK or not 0 <= words[3] <= MAX_LAYER_VARIABLES:
    return None
  return Binding(_float(words[1]), _float(words[2]), tuple(int(i) for i in words[4:4 + words[3]]))


def _bits(value: float) -> int:
  return int(np.array(value, np.float64).view(np.int64))


def _float(bits) -> float:
  return float(np.array(bits, np.int64).view(np.float64))


def decode(words: np.ndarray) -> Record:
  """The record in the words of a ``dp_record`` weight (all zeros: an empty one)."""
  words = np.asarray(words, np.int64)
  if words.shape != (DP_RECORD_WORDS,):
    raise ValueError(f"sparse-dp: a dp_record weight holds {DP_RECORD_WORDS} words, "
                     f"got shape {words.shape}")
  steps, non_poisson, datasets, length = (int(w) for w in words[:_HEADER])
  if not 0 <= length <= _CAPACITY:
    raise ValueError("sparse-dp: this dp_record weight is corrupt (its JSON length is "
                     f"{length}); it was not written by sparse-dp")
  payload = words[_HEADER:BINDING_START].astype("<i8").tobytes()[:length].decode()
  return Record.from_json(payload or "[]", steps, non_poisson, datasets)

