"""Refuses layers whose state is a statistic of data, unless declared public.

A model is released with every weight it holds. An adapted ``Normalization`` holds the mean
and variance of the data it was adapted on (one value moves them without bound), a
``Discretization`` its quantiles, a ``StringLookup``, ``IntegerLookup`` or
``TextVectorization`` the ids or words that occur (one example's rare id changes the
vocabulary): un-noised statistics, released outside the epsilon. Such a layer is refused at
``make_private`` unless its statistics come from public data (a public vocabulary, published
quantiles, or values computed with a DP mechanism whose epsilon the user accounts) and the
user names it in ``make_private(..., public_layers=[...])``. The same holds for a layer holding
a lookup table and for a frozen ``BatchNormalization`` whose moving statistics are not at
their initial values (:mod:`.held_state`). Constants written in a layer's configuration
(``Rescaling``'s scale) are the user's declared configuration. See docs/epsilon.md ("The
sample").
"""

from __future__ import annotations

from typing import Iterable

from sparse_dp._keras import keras
from sparse_dp.training.checks.held_state import held_tables, moved_statistics

_STATISTICS = {
    "Normalization": "the mean and variance",
    "Discretization": "the bin boundaries (quantiles)",
    "StringLookup": "the vocabulary (which strings occur)",
    "IntegerLookup": "the vocabulary (which ids occur)",
    "TextVectorization": "the vocabulary (which words occur)",
}


def statistics_problems(model: keras.Model, public_layers: Iterable[str] = ()) -> list[str]:
  """Why each preprocessing layer of ``model`` that holds statistics of data is refused."""
  public = set(public_layers)
  layers = list(model._flatten_layers(include_self=True))
  unknown = public - {layer.name for layer in layers}
  if unknown:
    raise ValueError(f"public_layers names {sorted(unknown)}, which model '{model.name}' does "
                     "not have; name its preprocessing layers (layer.name)")
  problems = []
  for layer in layers:
    if layer.name in public:
      continue
    declare = ("if it comes from public data (or a DP computation you account), declare it: "
               f"make_private(..., public_layers=['{layer.name}'])")
    held = _statistic(layer)
    if held is not None:
      problems.append(
          f"layer '{layer.name}' ({type(layer).__name__}) holds {held} of the data it was "
          "adapted on or given, released with the model without noise, outside the epsilon "
          f"(one example can change it); {declare}; else compute it on public data, or drop "
          "the layer and transform the features per example before poisson_dataset")
      continue
    tables = sorted({type(table).__name__ for table in held_tables(layer)})
    if tables:
      problems.append(
          f"layer '{layer.name}' ({type(layer).__name__}) holds or looks up a lookup table "
          f"({', '.join(tables)}), whose keys and values are a statistic of data unless they "
          "are public (a vocabulary of the ids that occur), released with the model without "
          f"noise; {declare}; else build it from public data, or map ids with "
          "keras.layers.Hashing")
    moved = moved_statistics(layer)
    if moved:
      problems.append(
          f"layer '{layer.name}' ({type(layer).__name__}) holds {', '.join(moved)} away from "
          "their initial values: statistics of the data it ran on before make_private "
          "(BatchNormalization's moving mean and variance), released with the model without "
          f"noise, outside the epsilon; {declare}; else reset them to their initial values "
          f"(layer.{moved[0]}.assign(...)) or compute them on public data")
  return problems


def _statistic(layer) -> str | None:
  """What data statistic ``layer`` holds, or ``None`` (a layer without one, e.g. Hashing)."""
  for cls in type(layer).__mro__:
    if cls.__name__ in _STATISTICS and cls.__module__.split(".")[0] in ("keras", "tf_keras"):
      return _STATISTICS[cls.__name__]
  if getattr(layer, "is_adapted", False):
    return "statistics of the data it was adapted on"
  return None
