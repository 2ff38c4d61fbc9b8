"""Refuses a forward pass that writes state: what it writes would be released without noise.

A DP step releases only the noisy update. An operation in the model's forward
pass or loss that writes state from the batch (a variable's ``assign_add``, a
``MutableHashTable.insert`` counting ids, a ``tf.summary`` or ``tf.print`` of
a batch value, a file written from it) keeps or publishes an un-noised
statistic of the private data, outside the epsilon. The DP step builds each
example's forward pass inside :func:`forward_without_state_writes`, which
reads the operations that pass created (and the functions they call) when the
step is traced, before it runs, and refuses any that writes. Random number
generators' state (data-independent) and reads are allowed; the metrics a
model holds are not updated in a DP step (:mod:`sparse_dp.training.dp_step.losses`).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import tensorflow as tf

# Operation types that write a variable, a lookup table, a summary, a file or a log.
WRITES = frozenset({
    "Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp",
    "AssignSubVariableOp", "ResourceStridedSliceAssign", "ScatterUpdate", "ScatterAdd",
    "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul", "ResourceScatterDiv",
    "ResourceScatterMin", "ResourceScatterMax", "ResourceScatterUpdate",
    "ResourceScatterNdAdd", "ResourceScatterNdSub", "ResourceScatterNdUpdate",
    "ResourceScatterNdMin", "ResourceScatterNdMax",
    "LookupTableInsert", "LookupTableInsertV2", "LookupTableRemoveV2", "LookupTableImport",
    "LookupTableImportV2", "InitializeTable", "InitializeTableV2",
    "InitializeTableFromTextFile", "InitializeTableFromTextFileV2",
    "InitializeTableFromDataset",
    "WriteSummary", "WriteScalarSummary", "WriteHistogramSummary", "WriteImageSummary",
    "WriteAudioSummary", "WriteRawProtoSummary", "WriteGraphSummary",
    "Print", "PrintV2", "WriteFile", "Save", "SaveV2", "SaveSlices",
    "QueueEnqueueV2", "QueueEnqueueManyV2", "PyFunc", "EagerPyFunc", "PyFuncStateless",
})
_FUNCTION_ATTRIBUTES = ("f", "body", "cond", "then_branch", "else_branch", "branches")


class StateWriteError(ValueError):
  """The forward pass of a DP step writes state from the batch."""

  # Raised while a step is traced: AutoGraph re-raises an error as its own type
  # only if its constructor is Exception's.
  __init__ = Exception.__init__


@contextlib.contextmanager
def forward_without_state_writes() -> Iterator[None]:
  """Refuses, when the block is traced, any operation it created that writes state."""
  graph = tf.compat.v1.get_default_graph()
  if tf.executing_eagerly():  # nothing to read; the DP step always traces its forward pass
    yield
    return
  start = len(graph.get_operations())
  yield
  written = [name for op in graph.get_operations()[start:] for name in _writes(graph, op)]
  if written:
    raise StateWriteError(
        f"sparse-dp: the model's forward pass or loss writes state from the batch "
        f"({', '.join(sorted(set(written))[:5])}): a variable assigned, a lookup table "
        "updated (an id counter), or a value printed, summarised or saved. What it writes is "
        "an un-noised statistic of the private data, released outside the epsilon (in "
        "checkpoints, logs or files). Remove the operation from the model's call and loss, "
        "or compute the value from each example alone without storing it")


def _writes(graph, op, depth: int = 0) -> list[str]:
  """Names of the writing operations of ``op`` and of the functions it calls."""
  if op.type in WRITES:
    return [f"{op.name} ({op.type})"]
  found = []
  if depth < 8:
    for name in _called_functions(op):
      definition = _function_def(graph, name)
      if definition is not None:
        found += [f"{op.name}/{node.name} ({node.op})" for node in definition.node_def
                  if node.op in WRITES]
  return found


def _called_functions(op) -> list[str]:
  names = []
  for attribute in _FUNCTION_ATTRIBUTES:
    try:
      value = op.get_attr(attribute)
    except ValueError:
      continue
    values = value if isinstance(value, list) else [value]
    names += [v.name for v in values if hasattr(v, "name")]
  return names


def _function_def(graph, name: str):
  while graph is not None:
    function = graph._get_function(name)
    if function is not None:
      return function.definition
    graph = getattr(graph, "outer_graph", None)
  return None
