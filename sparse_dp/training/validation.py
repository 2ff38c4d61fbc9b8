"""Refuses models whose examples are not separable, before any DP step (Opacus ``ModuleValidator`` style).

DP-SGD's guarantee rests on one bound: adding or removing one example moves
the clipped gradient sum ``G(D) = sum_i [grad l_i]_C2`` by at most ``C2``
(core paper Algorithm 1; Abadi et al. 2016). Per-example clipping gives that
bound only when

* example ``i``'s loss ``l_i`` is a function of example ``i``'s data alone, so
  that removing example ``j`` removes the one term ``[grad l_j]_C2`` and
  leaves the others unchanged; and
* the forward pass writes nothing learned from the batch into state that is
  released without noise (BatchNormalization's moving mean is the raw mean of
  the private batch).

Layers that mix examples break the first point with no error: measured with
zero noise and ``C2 = 1``, ``||G(D + z) - G(D)||`` is 62 with
``BatchNormalization`` in training mode, 78 with a ``Lambda`` that subtracts
the batch mean, 12-59 with TFRS's ``Retrieval`` task (in-batch softmax); the
reported epsilon is then false. Two checks refuse such models, naming the
layer or loss and the fix:

* :func:`check_model`, static, at ``make_private``: BatchNormalization in
  training mode, ``tfrs.tasks.Retrieval``, ``activity_regularizer``.
* :func:`check_separable`, a probe run once on the first batch: for any model
  and loss, including custom layers and ``Lambda``s.

**Retrieval with public negatives.** ``tfrs.tasks.Retrieval`` scores each
query against the other examples' candidates, so ``l_i`` depends on example
``j``'s candidate. A separable alternative scores each query against its own
positive and against ``K`` negatives drawn independently of the data (the
same public candidate list for everyone, or ids sampled uniformly from the
vocabulary), looked up *per example* so that clipping charges every lookup to
its example::

  class PublicNegativesRetrieval(tfrs.Model):
    def compute_loss(self, features, training=False):
      query = self.query_tower(features["user"])                        # [B, d]
      negatives = tf.tile(PUBLIC_IDS[None], [tf.shape(query)[0], 1])     # [B, K], data-independent
      candidates = self.item_tower(                                      # [B, 1 + K, d]; its
          tf.concat([features["item"][:, None], negatives], axis=1))     # Embedding has combiner=None
      logits = tf.einsum("bd,bkd->bk", query, candidates)
      return self.softmax_loss(tf.zeros_like(logits[:, 0], tf.int64), logits)  # positive: column 0
      # self.softmax_loss = SparseCategoricalCrossentropy(from_logits=True, reduction=NONE)

(``tests/keras_models.py`` has a runnable one.)
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator, NamedTuple, Optional

import numpy as np
import tensorflow as tf

from sparse_dp.layers.embedding import leading_dimension
from sparse_dp.layers.recording import recording
from sparse_dp.training import dense_layers

# Examples of the first batch the probe looks at: enough for a batch mean or
# an in-batch softmax to show, few enough that the n + 2 forward passes of the
# probe cost little. Prime, so that a tensor that merely happens to have this
# leading dimension (a hidden size of 16, say) is rarely taken for a batch.
PROBE_SIZE = 13

# Relative tolerance of the probe's comparisons, against the largest value
# compared: float32 rounding is ~1e-7 per operation, while one example of 13
# moves a batch statistic by ~1/13.
_TOLERANCE = 1e-4

_BATCH_NORMALIZATION = (tf.keras.layers.BatchNormalization,
                        tf.keras.layers.experimental.SyncBatchNormalization)

_RETRIEVAL_FIX = (
    "use negatives from a public candidate set instead: give each example K negative ids "
    "drawn independently of the data (e.g. tf.tile(public_ids[None], [batch, 1]) or uniform "
    "ids), look them up per example with the candidate tower (Embedding(combiner=None) on "
    "[batch, 1 + K] ids, the positive in column 0) and train on "
    "tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=NONE) with "
    "label 0; see the docstring of sparse_dp.training.validation")


class ModelValidationError(ValueError):
  """A model or loss that DP training cannot make private as it stands."""


def check_model(model: tf.keras.Model) -> None:
  """Refuses, by name and with the fix, the layers known to break per-example clipping.

  Looks at every layer, nested ones included:

  * ``BatchNormalization`` / ``SyncBatchNormalization`` that is trainable: in
    training mode it normalises each example by the statistics of the batch
    (``l_i`` depends on every example) and writes the raw batch statistics
    into its moving mean and variance, released without noise. A frozen one
    (``layer.trainable = False``) runs in inference mode in Keras 2: a fixed
    affine map of each example by its moving statistics, which is per
    example and sound provided those statistics are public (initial values,
    or computed on public data), since they are published as they are.
  * ``tfrs.tasks.Retrieval``: in-batch negatives; see the module docstring
    for the public-negatives pattern.
  * any layer with an ``activity_regularizer``: a penalty computed from the
    batch's activations, added to the loss outside the per-example clipping.
  """
  problems = []
  for layer in model._flatten_layers(include_self=True):  # pylint: disable=protected-access
    if isinstance(layer, _BATCH_NORMALIZATION) and layer.trainable:
      problems.append(
          f"{_describe(layer)} normalises each example by the statistics of its batch in "
          "training mode (one example's loss then depends on all the others) and stores the "
          "raw batch mean and variance, un-noised, in its moving statistics; remove it, use "
          "LayerNormalization(center=False, scale=False) (per-example statistics), or freeze "
          "it (layer.trainable = False: Keras then runs it in inference mode, a fixed map by "
          "its moving statistics, which must come from public data)")
    if _is_retrieval_task(layer):
      problems.append(
          f"{_describe(layer)} scores each query against the other examples' candidates "
          f"(in-batch softmax), so one example's loss depends on the others; {_RETRIEVAL_FIX}")
    if getattr(layer, "activity_regularizer", None) is not None:
      problems.append(
          f"{_describe(layer)} has an activity_regularizer, a penalty computed from the "
          "batch's activations that per-example clipping does not cover; remove it, or "
          "regularise the weights instead (kernel_regularizer, added after the noise)")
  if problems:
    raise ModelValidationError("sparse-dp cannot train this model privately:\n* " +
                               "\n* ".join(problems))


LossesOf = Callable[[object], tuple]  # batch -> (per-example losses [B], y, y_pred)


def check_separable(model: tf.keras.Model, leaves: list, losses_of: LossesOf, batch,
                    probe_size: int = PROBE_SIZE) -> bool:
  """Refuses a model whose examples' losses depend on each other, on a probe of one batch.

  Run eagerly, once, on the first batch, before the first DP step; it looks
  at the first ``min(batch size, probe_size)`` examples (``n``) with the
  step's own training-mode forward pass ``losses_of`` (``batch -> (losses
  [B], y, y_pred)``, :func:`sparse_dp.training.losses.per_example_loss_fn`)
  and the step's recording of ``leaves``
  (:func:`sparse_dp.training.dense_layers.trainable_leaf_layers`). A batch is
  ``(x, y)``, ``(x, y, sample_weight)`` or a features dict, with dense, ragged
  or sparse tensors. It refuses with a
  :class:`ModelValidationError` naming the layer or loss when

  1. **state**: a non-trainable variable (outside Keras metrics) changes in
     the forward pass; every variable is restored afterwards;
  2. **attribution**: an embedding lookup's batch is not the examples', or a
     lookup's example index is ``>= n`` (ids reshaped ``[B, L] -> [B L]``,
     shared candidate ids), or a ``Dense`` layer is applied to a tensor whose
     first dimension is not the examples;
  3. **gradients** (downstream coupling), in *one* forward pass, so dropout
     masks are the same for both sides: with random weights ``w``, for every
     per-example tensor ``t`` the step clips with (looked-up vectors, Dense
     pre-activations) and every float input feature,
     ``d(sum_i w_i l_i)/dt_j = w_j d(sum_i l_i)/dt_j`` row by row, which
     holds iff no ``l_i`` with ``i != j`` depends on ``t_j``;
  4. **removal** (coupling upstream of those tensors, e.g. a ``Lambda`` that
     centres the raw inputs over the batch, or integer ids mixed across
     examples): each loss ``l_i`` is unchanged when another example ``k`` is
     removed, for every ``k``. When the training-mode forward pass is
     deterministic (two runs agree) this compares the losses of whole passes;
     when it is random (dropout), it compares each deterministic layer's
     outputs on its recorded inputs with and without example ``k``, skipping
     layers whose own output is random (Dropout, GaussianNoise, which act
     element-wise); operations outside any layer are then covered by check 3
     only.

  A failing check names the innermost layer (or the loss) that mixes
  examples, found by the same comparisons applied to each layer's call. The
  outcome depends only on whether the probe passed; no value of the batch
  is printed. Returns ``False`` without checking when the batch has fewer
  than 2 examples (nothing can depend on another example): call it again
  on a later batch. Cost: ``n + 2`` forward passes of ``n`` examples, plus
  per-layer calls when a check fails or the model is random.
  """
  if not tf.executing_eagerly():
    raise RuntimeError("check_separable runs eagerly, before the first DP step; it was "
                       "called inside a tf.function")
  batch = tf.nest.map_structure(_as_tensor, batch)
  n = min(int(_batch_size(batch)), probe_size)
  if n < 2:
    return False
  probe = _take(batch, list(range(n)))
  with _restored_state(model) as state:
    trace = _trace(model, leaves, losses_of, probe, n)
    changed = state.changed()
    if changed:
      raise ModelValidationError(
          "sparse-dp: the training-mode forward pass updated the non-trainable variable(s) "
          f"{', '.join(changed)} from the batch; that state would be saved and released "
          "without noise. Remove the layer, freeze it (layer.trainable = False) if its "
          "state is fixed in inference mode, or make the update a function of the weights")
    state.restore()
    _check_attribution(trace, n)
    _check_gradients(model, trace, n)
    _check_removals(model, losses_of, probe, trace, n, state)
  return True


# The probe's trace of one forward pass.


class _PerExample(NamedTuple):
  """A tensor whose row ``r`` belongs to example ``example[r]`` (to example ``r`` if ``None``)."""

  description: str
  tensor: tf.Tensor
  example: Optional[tf.Tensor] = None


@dataclasses.dataclass
class _LayerCall:
  layer: tf.keras.layers.Layer
  args: tuple
  kwargs: dict
  outputs: object


@dataclasses.dataclass
class _Trace:
  """One recorded training-mode forward pass of the probe, on a persistent tape."""

  tape: tf.GradientTape
  losses: tf.Tensor  # [n]
  predictions: Optional[tf.Tensor]
  inputs: list  # _PerExample: the float input features
  lookups: list  # recording.Lookup
  dense_calls: list  # dense_layers.DenseCall
  layer_calls: list  # _LayerCall



def _trace(model, leaves, losses_of: LossesOf, probe, n: int) -> _Trace:
  inputs = [_PerExample(f"input feature {path}", t) for path, t in _flatten_with_paths(probe)
            if isinstance(t, tf.Tensor) and t.dtype.is_floating and _rows(t) == n]
  with tf.GradientTape(persistent=True) as tape:
    tape.watch([i.tensor for i in inputs])
    with recording() as lookups, dense_layers.recording_dense_calls(leaves) as dense_calls:
      with _recording_layer_calls(_probed_layers(model)) as layer_calls:
        losses, _, predictions = losses_of(probe)
  return _Trace(tape, tf.convert_to_tensor(losses), predictions, inputs, lookups.lookups,
                dense_calls, layer_calls)


def _probed_layers(model) -> list:
  """Every layer of ``model`` (itself included) that computes on the batch: not metrics."""
  return [layer for layer in model._flatten_layers(include_self=True)  # pylint: disable=protected-access
          if not isinstance(layer, tf.keras.metrics.Metric)]


@contextlib.contextmanager
def _recording_layer_calls(layers) -> Iterator[list]:
  """Within the block, every call of a layer in ``layers`` is recorded as a :class:`_LayerCall`.

  Wraps whatever ``call`` the layer has now (the DP step's Dense recorder
  included) and puts it back afterwards.
  """
  calls: list = []
  saved = {}
  graph = tf.compat.v1.get_default_graph()  # calls traced elsewhere are not the probe's
  for layer in layers:
    saved[layer] = layer.__dict__.get("call")
    layer.call = _recorded(layer, layer.call, calls, graph)
  try:
    yield calls
  finally:
    for layer, own in saved.items():
      if own is None:
        del layer.call
      else:
        layer.call = own


def _recorded(layer, call, calls: list, graph):
  def recorded_call(*args, **kwargs):
    outputs = call(*args, **kwargs)
    if tf.compat.v1.get_default_graph() is graph:
      calls.append(_LayerCall(layer, args, kwargs, outputs))
    return outputs
  return recorded_call


# The four checks.


def _check_attribution(trace: _Trace, n: int) -> None:
  problems = []
  for lookup in trace.lookups:
    examples = lookup.example.numpy()
    if int(lookup.batch_size) != n or (examples.size and examples.max() >= n):
      problems.append(
          f"embedding layer '{lookup.layer.name}' was called on ids whose batch dimension is "
          "not the examples (ids reshaped across examples, or shared ids such as a constant "
          "candidate set), so its lookups cannot be charged to their examples; call it on "
          "per-example ids of shape [batch, ...]")
  for call in trace.dense_calls:
    if _rows(call.inputs) != n:
      problems.append(
          f"Dense layer '{call.layer.name}' was applied to a tensor whose first dimension is "
          "not the examples; DP clipping charges row b of a Dense input to example b")
  if problems:
    _refuse(problems, _removal_culprits(trace, n))


def _check_gradients(model, trace: _Trace, n: int) -> None:
  """Check 3: ``d(sum w_i l_i)/dt_j = w_j d(sum l_i)/dt_j`` for every per-example tensor."""
  rows = list(trace.inputs)
  rows += [_PerExample(f"lookups of embedding layer '{l.layer.name}'", l.vectors, l.example)
           for l in trace.lookups]
  rows += [_PerExample(f"output of Dense layer '{c.layer.name}'", c.preactivation)
           for c in trace.dense_calls]
  weights = _probe_weights(n)
  with trace.tape:
    weighted = tf.reduce_sum(weights * trace.losses)
    total = tf.reduce_sum(trace.losses)
  tensors = [row.tensor for row in rows]
  mixed = [row.description for row, a, b in zip(rows, trace.tape.gradient(weighted, tensors),
                                                 trace.tape.gradient(total, tensors))
           if _not_per_example(a, b, weights, row.example)]
  if mixed:
    culprits = _gradient_culprits(model, trace, n) or [
        f"model '{model.name}' (operations in its call or loss outside any layer)"]
    raise ModelValidationError(
        f"sparse-dp: {' and '.join(culprits)} mixes examples: on a probe of {n} examples "
        f"of the first batch, one example's loss depends on another example's "
        f"{mixed[0]}. Per-example clipping bounds what one example can change only when "
        "each example's loss depends on that example alone; layers that normalise or "
        "centre over the batch (BatchNormalization in training mode, a Lambda over axis "
        "0), in-batch negatives and losses that are not per example (e.g. subtracting the "
        "batch mean loss) break the epsilon. Compute every statistic per example, or "
        "from public data")


def _check_removals(model, losses_of: LossesOf, probe, trace: _Trace, n: int, state) -> None:
  """Check 4: removing example ``k`` leaves every other example's loss unchanged."""
  again = tf.convert_to_tensor(losses_of(probe)[0])
  state.restore()
  if not _close(again, trace.losses):  # random forward pass: layer by layer
    culprits = _removal_culprits(trace, n)
    if culprits:
      _refuse_removal(culprits, n)
    return
  for k in range(n):
    kept = [i for i in range(n) if i != k]
    reduced = tf.convert_to_tensor(losses_of(_take(probe, kept))[0])
    state.restore()
    if not _close(reduced, tf.gather(trace.losses, kept)):
      _refuse_removal(_removal_culprits(trace, n) or [
          f"model '{model.name}' (operations in its call or loss outside any layer)"], n)


def _refuse_removal(culprits: list, n: int):
  raise ModelValidationError(
      f"sparse-dp: {' and '.join(culprits)} mixes examples: on a probe of {n} examples of "
      "the first batch, removing one example changed another example's loss. Per-example "
      "clipping bounds what one example can change only when each example's loss depends "
      "on that example alone; a layer that centres or normalises its inputs over the batch, "
      "or moves data between examples (a reshape across the batch axis), breaks the "
      "epsilon. Compute every statistic per example, or from public data")


def _refuse(problems: list, culprits: list):
  where = f" (the layer that mixes examples: {', '.join(culprits)})" if culprits else ""
  raise ModelValidationError("sparse-dp: " + "; ".join(problems) + where)


# Naming the culprit: the same comparisons, one layer call at a time.


def _gradient_culprits(model, trace: _Trace, n: int) -> list:
  """Innermost layers (or the loss) whose vector-Jacobian product is not per example.

  A call ``y = f(x)`` is per example iff its Jacobian is block-diagonal over
  examples, iff ``VJP(w * c) = w * VJP(c)`` row by row for a random
  cotangent ``c`` and random weights ``w``.
  """
  weights = _probe_weights(n)
  failing = [call.layer for call in trace.layer_calls
             if _vjp_not_per_example(trace.tape, _per_example(call.args, n, floating=True),
                                     _per_example(call.outputs, n, floating=True), weights)]
  culprits = [_describe(layer) for layer in _innermost(failing)]
  if not failing and trace.predictions is not None and _vjp_not_per_example(
      trace.tape, _per_example(trace.predictions, n, floating=True), [trace.losses], weights):
    culprits.append(f"the loss '{_loss_name(model)}'")
  return culprits


def _vjp_not_per_example(tape, inputs: list, outputs: list, weights) -> bool:
  if not inputs or not outputs:
    return False
  rng = np.random.default_rng(1)
  cotangents = [tf.constant(rng.normal(size=o.shape), o.dtype) for o in outputs]
  plain = tape.gradient(outputs, inputs, output_gradients=cotangents)
  weighted = tape.gradient(outputs, inputs, output_gradients=[
      c * tf.reshape(tf.cast(weights, c.dtype), [-1] + [1] * (c.shape.rank - 1))
      for c in cotangents])
  return any(_not_per_example(a, b, weights, None) for a, b in zip(weighted, plain))


def _removal_culprits(trace: _Trace, n: int) -> list:
  """Innermost layers whose output at example ``i`` changes when example ``k != i`` is removed.

  Each recorded call with per-example inputs is run again on its recorded
  inputs, with and without example ``k``; a call whose output differs
  between two runs on the same inputs is random (Dropout, GaussianNoise)
  and skipped.
  """
  failing = []
  for call in trace.layer_calls:
    if not _per_example(call.args, n, floating=False):
      continue
    again = _call_again(call, list(range(n)), n)
    if again is None or not _same_outputs(again, call.outputs, n, None):
      continue
    for k in range(n):
      kept = [i for i in range(n) if i != k]
      reduced = _call_again(call, kept, n)
      if reduced is not None and not _same_outputs(reduced, call.outputs, n, kept):
        failing.append(call.layer)
        break
  return [_describe(layer) for layer in _innermost(failing)]


def _call_again(call: _LayerCall, kept: list, n: int):
  """The layer's call on its recorded inputs restricted to examples ``kept``."""
  def restricted(value):
    return _take(value, kept) if _is_batch(value, n) else value
  args = tf.nest.map_structure(restricted, call.args, expand_composites=False)
  kwargs = tf.nest.map_structure(restricted, call.kwargs, expand_composites=False)
  try:
    return call.layer(*args, **kwargs)
  except (tf.errors.InvalidArgumentError, ValueError, TypeError):
    return None  # the call cannot take fewer examples: nothing to compare


def _same_outputs(new, recorded, n: int, kept: Optional[list]) -> bool:
  """``new`` equals ``recorded`` restricted to ``kept`` (all examples when ``None``).

  A recorded output whose first dimension is not the examples must come back
  identical: it may not depend on which examples are in the batch.
  """
  new, recorded = tf.nest.flatten(new), tf.nest.flatten(recorded)
  if len(new) != len(recorded):
    return False
  for a, b in zip(new, recorded):
    if kept is not None and _is_batch(b, n):
      b = _take(b, kept)
    a_parts = tf.nest.flatten(a, expand_composites=True)
    b_parts = tf.nest.flatten(b, expand_composites=True)
    if len(a_parts) != len(b_parts) or not all(
        x.shape == y.shape and _close(x, y) for x, y in zip(a_parts, b_parts)):
      return False
  return True


def _innermost(layers: list) -> list:
  """The layers of ``layers`` that contain none of the others."""
  found = {id(l) for l in layers}
  inner = []
  for layer in layers:
    nested = layer._flatten_layers(include_self=False)  # pylint: disable=protected-access
    if not any(id(l) in found for l in nested) and layer not in inner:
      inner.append(layer)
  return inner


# Small helpers.


class _State:
  """Every non-trainable variable of a model, snapshotted, to compare and restore."""

  def __init__(self, model):
    trainable = {v.ref() for v in model.trainable_variables}
    self.variables, seen = [], set()
    for layer in model._flatten_layers(include_self=True):  # pylint: disable=protected-access
      for variable in layer._trainable_weights + layer._non_trainable_weights:  # pylint: disable=protected-access
        if variable.ref() not in trainable and variable.ref() not in seen:
          seen.add(variable.ref())
          self.variables.append((variable, layer, tf.identity(variable)))

  def changed(self) -> list:
    """``'variable' of layer 'name'`` for each changed variable, metrics aside."""
    return [f"'{variable.name}' of {_describe(layer)}" for variable, layer, value in self.variables
            if not isinstance(layer, tf.keras.metrics.Metric)
            and not bool(tf.reduce_all(tf.equal(variable, value)))]

  def restore(self) -> None:
    for variable, _, value in self.variables:
      variable.assign(value)


@contextlib.contextmanager
def _restored_state(model) -> Iterator[_State]:
  state = _State(model)
  try:
    yield state
  finally:
    state.restore()


def _probe_weights(n: int) -> tf.Tensor:
  """Distinct random weights, fixed: what the probe reveals is pass or refuse only."""
  return tf.constant(np.random.default_rng(0).uniform(0.5, 1.5, n), tf.float32)


def _not_per_example(weighted, plain, weights, example) -> bool:
  """Whether ``weighted`` differs from ``weights[example] * plain`` row by row."""
  if weighted is None and plain is None:
    return False
  if weighted is None or plain is None:
    return True
  weighted, plain = tf.convert_to_tensor(weighted), tf.convert_to_tensor(plain)
  rows = tf.shape(plain)[0]
  scale = tf.gather(tf.cast(weights, plain.dtype),
                    tf.range(rows) if example is None else tf.cast(example, tf.int32))
  expected = plain * tf.reshape(scale, [-1] + [1] * (plain.shape.rank - 1))
  return not _close(weighted, expected)


def _close(a, b) -> bool:
  a, b = tf.convert_to_tensor(a), tf.convert_to_tensor(b)
  if a.shape != b.shape:
    return False
  if tf.size(a) == 0:
    return True
  a, b = tf.cast(a, tf.float64), tf.cast(b, tf.float64)
  largest = tf.maximum(tf.reduce_max(tf.abs(a)), tf.reduce_max(tf.abs(b)))
  return bool(tf.reduce_max(tf.abs(a - b)) <= _TOLERANCE * largest)


def _per_example(structure, n: int, floating: bool) -> list:
  """The tensors of ``structure`` whose first dimension is the ``n`` examples."""
  return [t for t in tf.nest.flatten(structure, expand_composites=False)
          if _is_batch(t, n) and (not floating or (isinstance(t, tf.Tensor)
                                                   and t.dtype.is_floating))]


def _is_batch(value, n: int) -> bool:
  return (isinstance(value, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor))
          and value.shape.rank != 0 and _rows(value) == n)


def _rows(value) -> int:
  if isinstance(value, tf.RaggedTensor):
    return int(value.nrows())
  if isinstance(value, tf.SparseTensor):
    return int(value.dense_shape[0])
  return int(leading_dimension(value))


def _batch_size(batch) -> int:
  first = tf.nest.flatten(batch, expand_composites=False)[0]
  return _rows(first)


def _as_tensor(value):
  if isinstance(value, (tf.Tensor, tf.RaggedTensor, tf.SparseTensor)):
    return value
  return tf.convert_to_tensor(value)


def _take(data, rows: list):
  """Examples ``rows`` of a batch (tensors, ragged or sparse tensors, in any nesting)."""
  indices = tf.constant(rows, tf.int64)

  def take(value):
    if isinstance(value, tf.SparseTensor):
      return _take_sparse(value, indices)
    if isinstance(value, (tf.Tensor, tf.RaggedTensor)) and value.shape.rank != 0:
      return tf.gather(value, indices)
    return value
  return tf.nest.map_structure(take, data, expand_composites=False)


def _take_sparse(value: tf.SparseTensor, indices: tf.Tensor) -> tf.SparseTensor:
  position = tf.scatter_nd(indices[:, None], tf.range(1, tf.size(indices, tf.int64) + 1),
                           value.dense_shape[:1]) - 1  # -1: a row not taken
  new_row = tf.gather(position, value.indices[:, 0])
  kept = new_row >= 0
  kept_indices = tf.concat([new_row[kept][:, None], tf.boolean_mask(value.indices, kept)[:, 1:]], 1)
  shape = tf.concat([tf.size(indices, tf.int64)[None], value.dense_shape[1:]], 0)
  return tf.sparse.reorder(tf.SparseTensor(kept_indices, tf.boolean_mask(value.values, kept), shape))


def _flatten_with_paths(structure, path: str = "") -> list:
  """``(name, leaf)`` for the leaves of nested dicts, lists and tuples."""
  if isinstance(structure, dict):
    items = [(f"{path}/{key}" if path else str(key), value) for key, value in structure.items()]
  elif isinstance(structure, (list, tuple)):
    items = [(f"{path}/{i}" if path else str(i), value) for i, value in enumerate(structure)]
  else:
    return [(f"'{path}'", structure)]
  return [leaf for name, value in items for leaf in _flatten_with_paths(value, name)]


def _describe(layer) -> str:
  return f"layer '{layer.name}' ({type(layer).__name__})"


def _loss_name(model) -> str:
  loss = getattr(model, "loss", None)
  return getattr(loss, "name", None) or getattr(loss, "__name__", None) or repr(loss)


def _is_retrieval_task(layer) -> bool:
  try:
    import tensorflow_recommenders as tfrs  # pylint: disable=import-outside-toplevel
  except ImportError:
    return False
  return isinstance(layer, tfrs.tasks.Retrieval)
