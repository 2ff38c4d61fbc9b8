"""The DP state of a model: what its weights were trained with, kept wherever they go.

``make_private`` attaches a :class:`DPState` to the model as ``model.dp_state``:
``steps_taken`` (DP steps over all its runs), ``non_poisson_steps`` (those whose batch was not
one of the package's Poisson samples, see ``POISSON_CAVEAT``), ``datasets_made`` (keys each
Poisson dataset's sample) and ``runs`` (JSON of every ``make_private`` run,
:class:`~sparse_dp.training.dp_state.dp_record.Run`). Each DP step also writes the state into
the ``dp_record`` weight of every layer that holds trained weights, so every Keras format
carries it, and attaching merges it with every layer's record
(:func:`~sparse_dp.training.dp_state.dp_record.merge`). The charge never goes back: steps run in
this process are also counted in :data:`_STEPS_RUN_HERE`, never saved, and each merge lifts a
run to ``max(steps its record shows, steps run here)``. The secret noise seed is never part of
the state. See docs/epsilon.md ("The DP state and the weight fingerprint").
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Optional

import numpy as np
import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.accounting import PrivacyAccountant
from sparse_dp.distribute import workers
from sparse_dp.layers.embedding import DP_RECORD_WORDS, add_dp_record
from sparse_dp.training.dp_state.dp_record import (
  BINDING_START,
  LAYER_WORD,
  MODEL_WORD,
  Binding,
  Record,
  Run,
  decode,
  decode_binding,
  encode,
  merge,
)

__all__ = ["DPState", "Run", "attach", "record_holders", "saved_state"]

STATE_ATTRIBUTE = "dp_state"

# Steps each run (by run_id) took in this process: never saved, never restored.
_STEPS_RUN_HERE: dict[str, tf.Variable] = {}

_FIRST_REPLICA = dict(trainable=False, synchronization=tf.VariableSynchronization.ON_WRITE,
                      aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)


class _Untracked:
  """What a :class:`DPState` uses but must not save: its layers, its active run, its binding."""

  def __init__(self, holders: list):
    self.holders = holders  # the layers that hold a dp_record weight
    self.active_run = None  # run_id of the run the DP step counts for
    self.places: Optional[list] = None  # bound: per holder, its variables' fingerprint indices
    self.fingerprint = None  # the Fingerprint the record is bound through
    self.arrived: list = []  # (holder, Binding or None) of the non-empty records when attached

  @property
  def weights(self) -> list:
    return [layer.dp_record for layer in self.holders]


class DPState(tf.__internal__.tracking.AutoTrackable):
  """Step counters and the runs' record, as variables a checkpoint saves.

  :func:`attach` makes it, as ``model.dp_state``. Its variables are ``steps_taken``,
  ``non_poisson_steps``, ``datasets_made``, ``weight_fingerprint`` and ``runs_json``.

  Args:
    strategy: the model's distribution strategy; the counters are made in its scope.
    holders: the model's layers whose ``dp_record`` weights are kept in step with the
      state (:func:`record_holders`).
  """

  def __init__(self, strategy: tf.distribute.Strategy, holders: list):
    self._strategy = strategy
    with strategy.scope():  # assigned in the replicated train_step
      self.steps_taken = tf.Variable(0, dtype=tf.int64, name="steps_taken", **_FIRST_REPLICA)
      self.non_poisson_steps = tf.Variable(0, dtype=tf.int64, name="non_poisson_steps",
                                           **_FIRST_REPLICA)
      self.datasets_made = tf.Variable(0, dtype=tf.int64, name="datasets_made", **_FIRST_REPLICA)
      # s(w) of the weights the DP step last left (sparse_dp.training.dp_state.weight_fingerprint).
      self.weight_fingerprint = tf.Variable(0.0, dtype=tf.float64, name="weight_fingerprint",
                                            **_FIRST_REPLICA)
    self.runs_json = workers.worker_local_variable(strategy, "[]", dtype=tf.string,
                                                   trainable=False, name="runs")
    self._untracked = _Untracked(holders)

  @property
  def record(self) -> Record:
    """The state as a :class:`Record` (what the variables hold now)."""
    return Record.from_json(self.runs_json.numpy().decode(), int(self.steps_taken.numpy()),
                            int(self.non_poisson_steps.numpy()),
                            int(self.datasets_made.numpy()))

  @property
  def runs(self) -> list[Run]:
    """Every recorded run, in the order they began."""
    return list(self.record.runs)

  @property
  def all_poisson(self) -> bool:
    """Whether every step so far was fed one of the package's Poisson samples."""
    return int(self.non_poisson_steps.numpy()) == 0

  def set_record(self, record: Record) -> None:
    """Sets the variables and every layer's ``dp_record`` weight to ``record``.

    Args:
      record: the runs and counters to hold.
    """
    self.runs_json.assign(record.runs_json())
    for variable, value in zip(self._counters(), (record.steps_taken, record.non_poisson_steps,
                                                  record.datasets_made)):
      variable.assign(value)
    for weight in self._untracked.weights:
      binding = decode_binding(weight.numpy())  # the weights it describes stay the same...
      if binding is not None and self._untracked.places is not None:  # ...but the model's now
        binding = dataclasses.replace(binding, model=float(self.weight_fingerprint.numpy()))
      weight.assign(encode(record, binding))

  def use_holders(self, holders: list) -> None:
    """Makes ``holders``' ``dp_record`` weights the ones kept in step.

    Args:
      holders: the model's layers that hold one now.
    """
    self._untracked.holders = holders

  def recorded_bindings(self) -> list:
    """``(layer, Binding or None)`` of each layer whose ``dp_record`` holds a record now.

    Returns:
      For each such layer (for example just loaded), the weights its record describes
        (:class:`~sparse_dp.training.dp_state.dp_record.Binding`; ``None``: not bound).
    """
    words = [(layer, layer.dp_record.numpy()) for layer in self._untracked.holders]
    return [(layer, decode_binding(w)) for layer, w in words if not decode(w).empty]

  @property
  def arrived_bindings(self) -> list:
    """:meth:`recorded_bindings` as the weights arrived at the last :func:`attach`."""
    return list(self._untracked.arrived)

  def bind(self, fingerprint) -> None:
    """Binds the record to the weights ``fingerprint`` reads now, in every layer's record.

    Args:
      fingerprint (Fingerprint): of the weights the DP step updates
        (:mod:`~sparse_dp.training.dp_state.weight_fingerprint`).
    """
    self.absorb_layers()  # records that came with the weights count first
    parts, _ = fingerprint.compute_each()
    index = {id(variable): i for i, variable in enumerate(fingerprint.variables)}
    places = [tuple(index[id(v)] for v in layer.trainable_weights if id(v) in index)
              for layer in self._untracked.holders]
    self.weight_fingerprint.assign(sum(parts))
    for layer, place in zip(self._untracked.holders, places):
      words = layer.dp_record.numpy()
      words[BINDING_START:] = Binding(sum(parts), sum(parts[i] for i in place), place).words()
      layer.dp_record.assign(words)
    self._untracked.places = places
    self._untracked.fingerprint = fingerprint

  def weights_moved(self) -> bool:
    """Whether the weights moved since the DP step (or a recorded release) last left them.

    Returns:
      ``True`` when the fingerprint of the weights changed; ``False`` when it did not, or
        when the record is not bound (no fingerprint kept).
    """
    fingerprint = self._untracked.fingerprint
    return fingerprint is not None and fingerprint.moved()

  def rebind(self) -> None:
    """Binds the record to the weights now, after a recorded release changed them (private
    Platt scaling folded into the logit layer, :meth:`record_release`)."""
    if self._untracked.fingerprint is not None:
      self.bind(self._untracked.fingerprint)

  def bind_in_step(self, deltas: dict) -> list:
    """In the DP step, after its update: every layer's binding moved with the weights.

    Args:
      deltas: each updated variable's change of ``s``, by its fingerprint index
        (:meth:`~sparse_dp.training.dp_state.weight_fingerprint.Fingerprint.after_update`).

    Returns:
      The assign ops (none unless :meth:`bind` was called).
    """
    if self._untracked.places is None:
      return []
    weights, places = self._untracked.weights, self._untracked.places
    if not weights:
      return []
    # Once for all layers: their records as rows, each layer's change of s as one segment
    # sum of its variables', both words of every row replaced in one scatter.
    records = tf.stack([tf.convert_to_tensor(weight) for weight in weights])  # [L, words]
    updated = sorted(deltas)
    pairs = [(k, updated.index(i)) for k, place in enumerate(places) for i in place
             if i in deltas]  # (layer, updated variable)
    layer_delta = tf.zeros([len(weights)], tf.float64)
    if pairs:
      layer_of, variable_of = (np.array(column, np.int64) for column in zip(*pairs))
      layer_delta = tf.math.unsorted_segment_sum(
          tf.gather(tf.stack([deltas[i] for i in updated]), variable_of), layer_of,
          len(weights))
    layer = tf.bitcast(records[:, LAYER_WORD], tf.float64) + layer_delta
    model = tf.fill([len(weights)], tf.bitcast(tf.convert_to_tensor(self.weight_fingerprint),
                                               tf.int64))
    rows = np.arange(len(weights))
    indices = np.stack([np.repeat(rows, 2), np.tile([MODEL_WORD, LAYER_WORD], len(weights))], 1)
    records = tf.tensor_scatter_nd_update(
        records, indices, tf.reshape(tf.stack([model, tf.bitcast(layer, tf.int64)], 1), [-1]))
    return [weight.assign(words) for weight, words in zip(weights, tf.unstack(records))]

  def absorb_layers(self) -> None:
    """Merges the records the layers hold (restored or shared weights) into the state."""
    layers = [decode(weight.numpy()) for weight in self._untracked.weights]
    live = self.record
    merged = merge([*layers, live], floor=self._steps_run_here(live))
    if merged != live or any(record != merged for record in layers):
      self.set_record(merged)

  def begin_run(self, run: Run) -> None:
    """Records ``run`` after the others; the DP step counts its steps from now on.

    Args:
      run: the run that begins.
    """
    self.absorb_layers()
    record = self.record
    self.set_record(dataclasses.replace(record, runs=record.runs + (run,)))
    if run.run_id not in _STEPS_RUN_HERE:
      with self._strategy.scope():
        _STEPS_RUN_HERE[run.run_id] = tf.Variable(0, dtype=tf.int64, name="dp_steps_run_here",
                                                  **_FIRST_REPLICA)
    self._untracked.active_run = run.run_id

  def record_release(self, run: Run, steps: int) -> None:
    """Records ``run`` as ``steps`` steps already taken on the host, outside the DP step.

    Such a release is a mechanism on the trained model, e.g. private Platt scaling
    (:mod:`sparse_dp.mechanisms.platt_scaling`), recorded after every step so far. The
    DP step's active run is not changed, but a step it takes after this would be
    counted as ``run``'s: record a release after the training.

    Args:
      run: the release's mechanism; its ``first_step`` is set to the steps so far.
      steps: the steps the release amounts to, >= 1.

    Raises:
      ValueError: ``steps < 1``.
    """
    if steps < 1:
      raise ValueError(f"steps must be >= 1, got {steps}")
    self.absorb_layers()
    record = self.record
    run = dataclasses.replace(run, first_step=record.steps_taken)
    self.set_record(dataclasses.replace(record, runs=record.runs + (run,),
                                        steps_taken=record.steps_taken + steps))

  def count_step(self, poisson: tf.Tensor, counted=True) -> None:
    """In the DP step, after its batch is read: one more step, in every record.

    Args:
      poisson: a boolean tensor, whether the batch was one of this run's Poisson
        samples.
      counted: a boolean (tensor): false for a refused step, which used no data and
        counts nothing.
    """
    step = tf.cast(counted, tf.int64)
    self.steps_taken.assign_add(step)
    self._count_in_records(step * tf.cast(tf.logical_not(poisson), tf.int64), step)

  def number_step(self) -> tf.Tensor:
    """Counts one Poisson step before it runs and returns its number (the steps before it).

    For steps that run at once (parameter-server workers), in cross-replica
    context. ``steps_taken`` is read and incremented by one atomic op under the
    variable's lock (``ResourceCountUpTo``, a fetch-and-add), so no two calls,
    whichever worker makes them, get the same number, and a call that got a
    number has been counted whatever happens to its step after. The number
    returned depends on the count in every record. ``steps_taken`` is saved with
    the model and never goes back in a process (:meth:`absorb_layers`), so the
    numbers do not repeat across restarts from the latest checkpoint either.

    Returns:
      The step's number: the steps counted before it, an int64 scalar.
    """
    numbers = self._strategy.extended.update(self.steps_taken, _fetch_and_increment)
    number = self._strategy.experimental_local_results(numbers)[0]
    one = tf.constant(1, tf.int64)
    with tf.control_dependencies(self._count_in_records(tf.constant(0, tf.int64), one)):
      return tf.identity(number)

  def _count_in_records(self, non_poisson: tf.Tensor, step: tf.Tensor) -> list:
    """Counts ``step`` (1, or 0 for a refused step) steps, ``non_poisson`` of them not
    fed a Poisson sample, in every record but ``steps_taken``; returns the count ops."""
    counts = [self.non_poisson_steps.assign_add(non_poisson),
              _STEPS_RUN_HERE[self._untracked.active_run].assign_add(step)]
    # Each record counts on from what it holds (a record restored since the last
    # merge stays consistent; the next merge charges it and ours both).
    increment = tf.pad(tf.stack([step, non_poisson]), [[0, DP_RECORD_WORDS - 2]])
    return counts + [weight.assign_add(increment) for weight in self._untracked.weights]

  def _steps_run_here(self, record: Record) -> dict[str, int]:
    return {run_id: int(_STEPS_RUN_HERE[run_id].numpy()) for run_id in record.runs_by_id()
            if run_id in _STEPS_RUN_HERE}

  def accountant(self, kind: str = "pld") -> PrivacyAccountant:
    """Every run's spends: its selection once, then its Gaussian steps.

    Merges the layers' records and the steps run here first, so the counters
    never go back: after a rollback ``steps_taken`` is again every step run.

    Args:
      kind: ``"pld"`` (default) or ``"rdp"``.

    Returns:
      An accountant of every recorded run: its selection's and statistics' pure
        epsilons, then its steps.
    """
    self.absorb_layers()
    accountant = PrivacyAccountant(kind)
    record = self.record
    runs = record.runs_by_id()
    for run_id, steps in record.steps_by_run().items():
      run = runs[run_id]
      for spent in (run.selection_epsilon, run.statistics_epsilon):
        if spent > 0:
          accountant.spend_pure(spent)
      accountant.step(run.noise_multiplier, run.sampling_rate, steps, run.truncation)
    return accountant

  def restore(self, path: str) -> None:
    """Adds the state saved at ``path`` to this one.

    Args:
      path: a checkpoint or SavedModel, as :func:`saved_state` takes it.

    Raises:
      ValueError: ``path`` holds no DP state, or more than one.
    """
    live = self.record
    self.set_record(merge([saved_state(path), live], floor=self._steps_run_here(live)))

  def _counters(self) -> tuple[tf.Variable, tf.Variable, tf.Variable]:
    return self.steps_taken, self.non_poisson_steps, self.datasets_made


def _fetch_and_increment(counter: tf.Variable) -> tf.Tensor:
  """``counter``'s value before one atomic increment (raises at the int64 maximum)."""
  return tf.raw_ops.ResourceCountUpTo(resource=counter.handle, limit=tf.int64.max, T=tf.int64)


def record_holders(model: keras.Model) -> list:
  """The layers of ``model`` that hold a ``dp_record`` weight, one added where a model has none.

  Every ``sparse_dp.layers.Embedding`` has one from its ``build``. A model with
  none gets one on each trainable ``Dense`` (so a fresh copy of it must go
  through ``make_private`` before ``load_weights``/``set_weights`` of a trained
  one; Keras refuses the weight count otherwise).

  Args:
    model: the model whose layers hold the trained weights.

  Returns:
    The layers, one per distinct ``dp_record`` weight.
  """
  layers = list(model._flatten_layers(include_self=True))
  holders = list({id(layer.dp_record): layer for layer in layers
                  if isinstance(getattr(layer, "dp_record", None), tf.Variable)}.values())
  if holders:
    return holders
  dense = [layer for layer in layers if isinstance(layer, keras.layers.Dense) and layer.trainable]
  with model.distribute_strategy.scope():
    for layer in dense:
      layer.dp_record = add_dp_record(layer)
  return dense


def attach(model: keras.Model) -> DPState:
  """``model``'s state, made and attached on first use, merged with its layers' records.

  Attaching restores a state that ``model.load_weights`` read earlier
  (TensorFlow's deferred restoration), and a model from
  ``keras.models.load_model`` brings its saved state's variables, which are
  copied in; the layers' ``dp_record`` weights (any format, or layers trained
  in another model) are merged in.

  Args:
    model: the model to make private.

  Returns:
    ``model.dp_state``.
  """
  holders = record_holders(model)
  loaded = getattr(model, STATE_ATTRIBUTE, None)
  if isinstance(loaded, DPState):
    loaded.use_holders(holders)
  else:
    state = DPState(model.distribute_strategy, holders)
    if loaded is not None:
      for name in _VARIABLES:
        getattr(state, name).assign(getattr(loaded, name))
    setattr(model, STATE_ATTRIBUTE, state)
  state = getattr(model, STATE_ATTRIBUTE)
  state._untracked.arrived = state.recorded_bindings()
  state.absorb_layers()
  return state


_VARIABLES = ("steps_taken", "non_poisson_steps", "datasets_made", "runs_json")


def saved_state(path: str) -> Record:
  """The DP state saved at ``path``: ``dp_state`` and every ``dp_record`` there, merged.

  Args:
    path: a TF-format weights prefix (``save_weights``, ``ModelCheckpoint`` with
      ``save_weights_only=True``), a ``tf.train.Checkpoint`` prefix, a folder with a
      ``checkpoint`` file (its latest), or a SavedModel folder (``model.save``).

  Returns:
    The merged record of every run saved there.

  Raises:
    ValueError: ``path`` holds no DP state or more than one model's; it is a folder
      with neither a SavedModel nor a checkpoint; or it is an ``.h5`` or ``.keras``
      file (load those with Keras, then call ``make_private`` without ``resume_from``).
  """
  reader = tf.train.load_checkpoint(_checkpoint_prefix(path))
  keys = reader.get_variable_to_shape_map()
  records = [decode(reader.get_tensor(k)) for k in keys
             if re.search(r"(^|/)dp_record/\.ATTRIBUTES/VARIABLE_VALUE$", k)]
  state: dict = {}
  for name in _VARIABLES:
    pattern = re.compile(rf"(^|/){STATE_ATTRIBUTE}/{name}/\.ATTRIBUTES/VARIABLE_VALUE$")
    matches = [k for k in keys if pattern.search(k)]
    if len(matches) > 1:
      raise ValueError(f"resume_from={path!r}: more than one sparse-dp DP state "
                       f"({STATE_ATTRIBUTE}/{name}) in this checkpoint; give a checkpoint "
                       "of one model")
    if matches:
      state[name] = reader.get_tensor(matches[0])
  if len(state) == len(_VARIABLES):
    records.insert(0, Record.from_json(state["runs_json"].decode(), int(state["steps_taken"]),
                                       int(state["non_poisson_steps"]),
                                       int(state["datasets_made"])))
  saved = merge(records)
  if saved.empty:
    raise ValueError(
        f"resume_from={path!r}: no sparse-dp DP state in this checkpoint; give a checkpoint "
        "of a model that make_private trained (saved after make_private)")
  return saved


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
    raise ValueError(
        f"resume_from={path!r}: resume_from reads TF format checkpoints; load an .h5 or "
        ".keras file with model.load_weights / keras.models.load_model instead (their "
        "dp_record weights carry the DP state) and call make_private without resume_from")
  return path
