"""Whether a model's DP record describes the weights it holds now.

Every layer's ``dp_record`` is bound to weights (:class:`~.dp_record.Binding`): the
fingerprint ``s(w)`` of the model that wrote it, and the part of it from the layer's own
variables (:mod:`.weight_fingerprint`). Only the DP step (and a recorded release, such as
private Platt scaling) moves them with the weights. Weights that arrive with records (loaded,
restored, layers reused in a new model) are covered if every record's layer still holds the
weights its record describes and the rest of the model is the record's, or else has not been
trained: a model whose optimizer took steps (``optimizer.iterations > 0``) on weights no record
describes was trained without DP. See docs/epsilon.md ("The DP state and the weight
fingerprint").
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from sparse_dp.training.dp_state.dp_record import BINDING_START, decode_binding
from sparse_dp.training.dp_state.weight_fingerprint import (
  Fingerprint,
  WeightsMovedOutsideDPError,
  read_sum,
)

_START_FROM = ("Start from the weights a DP run saved (load them, with their dp_record) or from "
               "a freshly built model")


def fingerprinted_variables(model, engine_tables=()) -> list:
  """The variables the weight fingerprint covers: ``model``'s trainable variables but the
  tables an embedding engine holds (``engine_tables``, Embedding layers)."""
  held = {id(layer.embeddings) for layer in engine_tables}
  return [v for v in model.trainable_variables if id(v) not in held]


def refuse_undescribed(model, state) -> None:
  """Refuses to release an epsilon for ``model`` unless its record describes all its weights
  (a teacher loaded to be distilled, a model about to be reported on).

  Args:
    model (keras.Model): a model with a DP record.
    state (DPState): its state, attached.

  Raises:
    WeightsMovedOutsideDPError: its records are not bound, or describe other weights.
  """
  bindings = state.recorded_bindings()
  fingerprint = Fingerprint(fingerprinted_variables(model), state.weight_fingerprint)
  reason = unbound_reason(bindings, fingerprint, strict=True) if bindings else None
  if reason is not None:
    raise WeightsMovedOutsideDPError(
        f"sparse-dp: the weights of model '{model.name}' carry a DP record, but {reason}: no "
        f"epsilon covers them, so none is given. {_START_FROM}")


def _layer_moved(layer, binding) -> Optional[str]:
  """Why ``layer``'s weights are not those its record's ``binding`` describes, if they aren't."""
  variables = layer.trainable_weights
  if not binding.indices:  # its table was held by an embedding engine: not fingerprinted
    return None
  if len(binding.indices) != len(variables):
    return f"layer '{layer.name}' has other variables than its DP record describes"
  total, magnitude = 0.0, 0.0
  for index, variable in zip(binding.indices, variables):
    part, size = read_sum(index, variable)
    total, magnitude = total + part, magnitude + size
  if not Fingerprint.close(total, binding.layer, magnitude):
    return (f"the weights of layer '{layer.name}' are not those its DP record describes: they "
            "moved outside the DP step (a plain fit or a custom loop, an assign, "
            "set_weights/load_weights from a model trained without DP)")
  return None


def unbound_reason(bindings: list, fingerprint: Fingerprint, strict: bool) -> Optional[str]:
  """Why the records do not cover the weights ``fingerprint`` reads, if they don't.

  Args:
    bindings: ``(layer, Binding or None)`` of each non-empty record
      (:meth:`~sparse_dp.training.dp_state.state.DPState.recorded_bindings`).
    fingerprint: of the weights the DP step updates.
    strict: the whole model must be the one the records describe (weights loaded into a
      private model); else only the records' layers must be (a model built on them).

  Returns:
    ``None`` when the records cover the weights; else the reason.
  """
  reason = _layers_reason(bindings)
  if reason is None and strict and not _describes_model(bindings, fingerprint):
    return "they are not the weights their DP record describes"
  return reason


def _layers_reason(bindings: list) -> Optional[str]:
  """Why a record is unbound or its layer moved since it, if one is."""
  if any(binding is None for _, binding in bindings):
    return ("their DP record is not bound to any weights (written by a sparse-dp older than "
            "the weight fingerprint, or under ParameterServerStrategy)")
  for layer, binding in bindings:
    reason = _layer_moved(layer, binding)
    if reason is not None:
      return reason
  return None


def _describes_model(bindings: list, fingerprint: Fingerprint) -> bool:
  """Whether every record's model part is the fingerprint of the weights now (one read)."""
  now, magnitude = fingerprint.compute()
  return all(fingerprint.close(now, binding.model, magnitude) for _, binding in bindings)


def refuse_unbound_weights(model, bindings: list, fingerprint: Fingerprint) -> None:
  """Refuses weights no DP record covers: ``make_private``'s first check.

  Args:
    model (keras.Model): the model about to be trained.
    bindings: ``(layer, Binding or None)`` of its non-empty records, as they arrived.
    fingerprint: of the weights the DP step will update.

  Raises:
    WeightsMovedOutsideDPError: a record's layer moved since its record; or weights no
      record describes were trained (the model's optimizer has taken steps).
  """
  reason = _layers_reason(bindings) if bindings else None
  if reason is not None:
    raise WeightsMovedOutsideDPError(
        f"sparse-dp: the weights of model '{model.name}' carry a DP record, but {reason}: no "
        f"epsilon covers them, so none is given. {_START_FROM}")
  optimizer = getattr(model, "optimizer", None)
  iterations = int(optimizer.iterations.numpy()) if optimizer is not None else 0
  if iterations == 0 or (bindings and _describes_model(bindings, fingerprint)):
    return  # never trained outside a record, or the model its records describe
  raise WeightsMovedOutsideDPError(
      f"sparse-dp: model '{model.name}' has weights no DP record describes, and its "
      f"optimizer has taken {iterations} step(s) (optimizer.iterations): they were trained "
      f"without DP, and no epsilon would cover them. {_START_FROM}. If those steps used "
      "public data only, compile the model with a fresh optimizer before make_private: "
      "that declares the weights without a record public")


def rebound_record(words: np.ndarray, layer_name: str, before: list, after: list) -> np.ndarray:
  """A layer's ``dp_record`` words for its weights changed by a post-processing of them (a
  stream period carrying a table's rows over to a new preselection, whose buckets are DP).

  Args:
    words: the layer's saved ``dp_record`` words.
    layer_name: the layer's name, for the error.
    before: the layer's trainable weights as saved with ``words``.
    after: the same weights once changed.

  Returns:
    The words with the layer's part of the binding that of ``after`` (the model's part no
      longer matches: the rest of the model is checked as a new model's).

  Raises:
    WeightsMovedOutsideDPError: ``before`` is not what the record describes.
  """
  binding = decode_binding(words)
  if binding is None or not binding.indices:
    return words
  parts = [read_sum(index, value) for index, value in zip(binding.indices, before)]
  if len(before) != len(binding.indices) or not Fingerprint.close(
      sum(p for p, _ in parts), binding.layer, sum(m for _, m in parts)):
    raise WeightsMovedOutsideDPError(
        f"sparse-dp: the saved weights of layer '{layer_name}' are not those its DP record "
        f"describes: no epsilon covers them. {_START_FROM}")
  layer = sum(read_sum(index, value)[0] for index, value in zip(binding.indices, after))
  words = np.array(words, np.int64)
  words[BINDING_START:] = dataclasses.replace(binding, model=float("nan"), layer=layer).words()
  return words
