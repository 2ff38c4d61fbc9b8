"""The DP state a model carries into its checkpoints, so a budget lasts across jobs.

``make_private`` attaches a :class:`DPState` to the model as ``model.dp_state``;
Keras and TensorFlow then save it with the weights (``save_weights`` in the TF
format, ``ModelCheckpoint``, ``model.save``, ``tf.train.Checkpoint(model=...)``):

* ``steps_taken``: DP steps the model has taken, over all its runs;
* ``non_poisson_steps``: those whose batch was not one of the package's
  Poisson samples (their epsilon is not proved, see ``POISSON_CAVEAT``);
* ``datasets_made``: Poisson datasets made for it so far (keys each one's sample);
* ``runs``: JSON of every ``make_private`` run on the model: its noise, its
  sampling rate, the step it started at, its pure-DP selection spend, delta
  and budget. Run ``i`` took ``first_step[i + 1] - first_step[i]`` steps (the
  last one ``steps_taken - first_step``), each a Poisson-subsampled Gaussian of
  its noise multiplier and rate; the accountant composes them all.

The secret noise seed is never part of the state: anyone holding it could
regenerate and subtract the noise. A resumed run draws a fresh one; its noise
is keyed by the step counter and its samples by the dataset counter, which both
continue, so even a fixed ``noise_seed`` never repeats a draw.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import uuid
from typing import Optional

import tensorflow as tf

from sparse_dp.accounting import PrivacyAccountant

STATE_ATTRIBUTE = "dp_state"


@dataclasses.dataclass(frozen=True)
class Run:
  """One ``make_private`` run: what each of its steps costs."""

  algorithm: str
  noise_multiplier: float  # of the one Gaussian each step amounts to
  sampling_rate: float
  first_step: int
  num_examples: int
  delta: float
  selection_epsilon: float = 0.0  # pure DP, spent once at the start of the run
  epsilon_budget: Optional[float] = None
  debug_metrics: bool = False
  run_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex)

  def continued_by(self, other: "Run") -> bool:
    """Whether ``other`` trains as this run did (same mechanism, rate and selection)."""
    return ((self.algorithm, self.noise_multiplier, self.sampling_rate, self.selection_epsilon)
            == (other.algorithm, other.noise_multiplier, other.sampling_rate,
                other.selection_epsilon))


class DPState(tf.__internal__.tracking.AutoTrackable):
  """Step counters and the runs' record, as variables a checkpoint saves."""

  def __init__(self, strategy: tf.distribute.Strategy):
    with strategy.scope():  # assigned in the replicated train_step
      counter = dict(dtype=tf.int64, trainable=False,
                     synchronization=tf.VariableSynchronization.ON_WRITE,
                     aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
      self.steps_taken = tf.Variable(0, name="steps_taken", **counter)
      self.non_poisson_steps = tf.Variable(0, name="non_poisson_steps", **counter)
      self.datasets_made = tf.Variable(0, name="datasets_made", **counter)
    self.runs_json = tf.Variable("[]", dtype=tf.string, trainable=False, name="runs")

  @property
  def runs(self) -> list[Run]:
    return [Run(**run) for run in json.loads(self.runs_json.numpy().decode())]

  def begin_run(self, run: Run) -> None:
    self.runs_json.assign(json.dumps([dataclasses.asdict(r) for r in self.runs + [run]]))

  @property
  def all_poisson(self) -> bool:
    return int(self.non_poisson_steps.numpy()) == 0

  def accountant(self, kind: str = "pld") -> PrivacyAccountant:
    """Every run's spends: its selection, then its Poisson-subsampled Gaussian steps."""
    accountant = PrivacyAccountant(kind)
    runs = self.runs
    ends = [r.first_step for r in runs[1:]] + [int(self.steps_taken.numpy())]
    for run, end in zip(runs, ends):
      if run.selection_epsilon > 0:
        accountant.spend_pure(run.selection_epsilon)
      accountant.step(run.noise_multiplier, run.sampling_rate, end - run.first_step)
    return accountant

  def restore(self, path: str) -> None:
    """Sets this state to the one saved at ``path`` (see :func:`saved_state`)."""
    for name, value in saved_state(path).items():
      getattr(self, name).assign(value)


def attach(model: tf.keras.Model) -> DPState:
  """``model``'s state, made and attached on first use.

  Attaching restores a state that ``model.load_weights`` read earlier
  (TensorFlow's deferred restoration), and a model from
  ``tf.keras.models.load_model`` brings its saved state's variables, which are
  copied in: restored weights carry their budget.
  """
  loaded = getattr(model, STATE_ATTRIBUTE, None)
  if isinstance(loaded, DPState):
    return loaded
  state = DPState(model.distribute_strategy)
  if loaded is not None:
    for name in _VARIABLES:
      getattr(state, name).assign(getattr(loaded, name))
  setattr(model, STATE_ATTRIBUTE, state)
  return getattr(model, STATE_ATTRIBUTE)


_VARIABLES = ("steps_taken", "non_poisson_steps", "datasets_made", "runs_json")


def saved_state(path: str) -> dict:
  """The DP state saved at ``path``, by :class:`DPState` attribute.

  ``path`` is a TF-format weights prefix (``save_weights``, ``ModelCheckpoint``
  with ``save_weights_only=True``), a ``tf.train.Checkpoint`` prefix or a folder
  with a ``checkpoint`` file (its latest), or a SavedModel folder (``model.save``).
  """
  reader = tf.train.load_checkpoint(_checkpoint_prefix(path))
  keys = reader.get_variable_to_shape_map()
  found: dict = {}
  for name in _VARIABLES:
    pattern = re.compile(rf"(^|/){STATE_ATTRIBUTE}/{name}/\.ATTRIBUTES/VARIABLE_VALUE$")
    matches = [k for k in keys if pattern.search(k)]
    if len(matches) != 1:
      raise ValueError(
          f"resume_from={path!r}: {'no' if not matches else 'more than one'} sparse-dp DP "
          f"state ({STATE_ATTRIBUTE}/{name}) in this checkpoint; give a checkpoint of one "
          "model that make_private trained (saved after make_private)")
    found[name] = reader.get_tensor(matches[0])
  return found


def _checkpoint_prefix(path: str) -> str:
  path = os.fspath(path)
  if tf.saved_model.contains_saved_model(path):
    return os.path.join(path, "variables", "variables")
  if tf.io.gfile.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if latest is None:
      raise ValueError(f"resume_from={path!r}: a folder with neither a SavedModel nor a "
                       "TF checkpoint; give the prefix that save_weights or "
                       "ModelCheckpoint wrote (TF format, not .h5)")
    return latest
  if path.endswith((".h5", ".keras")):
    raise ValueError(f"resume_from={path!r}: HDF5 / .keras weight files do not hold the DP "
                     "state; save in the TF format (a path without .h5) or with model.save")
  return path
