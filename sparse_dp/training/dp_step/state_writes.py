"""Refuses a forward pass that may write state: what it writes would be released without noise.

A DP step releases only the noisy update. An operation in the model's forward
pass or loss that writes state from the batch (a variable's ``assign_add``, a
raw training op on a non-trainable weight, a ``MutableHashTable.insert``
counting ids, a random generator advanced by a data-dependent count, a
``tf.summary`` or ``tf.print`` of a batch value) keeps or publishes an
un-noised statistic of the private data, outside the epsilon. The DP step
builds each example's forward pass inside :func:`forward_without_state_writes`,
which reads the operations that pass created, and those of the functions they
call, when the step is traced, before it runs. Every operation that is stateful
or takes a resource must be on an allow-list (:data:`READS`,
:data:`CONTROL_FLOW`, :data:`FIXED_SIZE_DRAWS`); any other is refused, named
with its fix. See docs/epsilon.md ("Separable by construction").
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import tensorflow as tf

# Reads of a variable (its handle, value, rows or shape) or of a lookup table, and a
# handle passed along unread.
READS = frozenset({
    "VarHandleOp", "ReadVariableOp", "ResourceGather", "ResourceGatherNd", "VariableShape",
    "VarIsInitializedOp", "LookupTableFindV2", "LookupTableSizeV2", "Identity", "IdentityN",
})
# Calls and control flow, whose bodies are read in turn; assertions, which write nothing.
CONTROL_FLOW = frozenset({
    "StatefulPartitionedCall", "PartitionedCall", "If", "StatelessIf", "While",
    "StatelessWhile", "Case", "StatelessCase", "Assert", "CheckNumerics", "CheckNumericsV2",
})
# Draws of the random ops whose state is in their kernel, saved nowhere (no variable holds
# it), by the input that sizes the draw: allowed when it is a constant of the graph
# (Keras's Dropout and GaussianNoise on a fixed shape), so each example advances the
# state by a count independent of its data.
FIXED_SIZE_DRAWS = {"RandomUniform": 0, "RandomUniformInt": 0, "RandomStandardNormal": 0,
                    "TruncatedNormal": 0}
_GENERATOR_OPS = frozenset({
    "RngSkip", "RngReadAndSkip", "StatefulUniform", "StatefulUniformFullInt",
    "StatefulUniformInt", "StatefulStandardNormal", "StatefulStandardNormalV2",
    "StatefulTruncatedNormal", "StatefulRandomBinomial",
})
_FUNCTION_ATTRIBUTES = ("f", "body", "cond", "then_branch", "else_branch", "branches")
_FIX = {
    "generator": (
        "it advances a tf.random.Generator, whose state is a variable saved with the model; "
        "the per-example map advances it once per example, by a count that reveals the "
        "batch's size, a statistic of the private sample: draw with tf.random.stateless_* "
        "from a seed of your configuration, or use Keras's Dropout or GaussianNoise"),
    "draw": (
        "it draws a number of random values that is not a constant of the graph (it depends "
        "on the example), so its random stream advances by a count of the data: draw "
        "a fixed shape (pad to a fixed length), or use tf.random.stateless_* with a seed "
        "of your configuration"),
    "unread": (
        "it calls a function whose operations cannot be read; call the function directly "
        "in the model's call, or write its operations there"),
    "write": (
        "it is not on the allow-list of reads, fixed-size random draws and control flow: it "
        "may write a variable, a lookup table, a summary, a log or a file, and what it "
        "writes is an un-noised statistic of the private data, released outside the epsilon "
        "(in checkpoints, logs or files); remove it from the model's call and loss, or "
        "compute the value from each example alone without storing it"),
}


class StateWriteError(ValueError):
  """The forward pass of a DP step writes state from the batch."""

  # Raised while a step is traced: AutoGraph re-raises an error as its own type
  # only if its constructor is Exception's.
  __init__ = Exception.__init__


@contextlib.contextmanager
def forward_without_state_writes() -> Iterator[None]:
  """Refuses, when the block is traced, any operation it created that is not allowed.

  Raises:
    StateWriteError: an operation of the block, or of a function it calls, is stateful or
      takes a resource and is not on the allow-list; the message names each (its name
      holds the name scope of the layer that created it) with its fix.
  """
  graph = tf.compat.v1.get_default_graph()
  if tf.executing_eagerly():  # nothing to read; the DP step always traces its forward pass
    yield
    return
  start = len(graph.get_operations())
  yield
  refused = _refused(graph, graph, graph.get_operations()[start:], "", set())
  if refused:
    kinds = ", ".join(sorted({kind for _, kind, _ in refused}))
    raise StateWriteError(
        "sparse-dp: the model's forward pass or loss writes state from the batch, or may "
        f"({kinds}): each operation that is stateful or takes a resource must be a read of "
        "a variable or lookup table, a random draw of a fixed size, or control flow. Refused "
        "(the operation's name holds the layer's name scope):\n* " +
        "\n* ".join(f"{name} ({kind}): {_FIX[fix]}" for name, kind, fix in refused[:5]))


def _refused(root, graph, ops: list, prefix: str, seen: set) -> list[tuple[str, str, str]]:
  """``(name, type, fix)`` of each operation of ``ops`` and its callees that is not allowed.

  ``graph`` holds ``ops``; ``root``, the graph the step traces, holds the functions too.
  """
  found = []
  for op in ops:
    by_type = _function_graph(graph, op.type) or _function_graph(root, op.type)
    called = _called_functions(op) + ([op.type] if by_type is not None else [])
    for name in called:
      body = _function_graph(graph, name) or _function_graph(root, name)
      if body is None:
        found.append((f"'{prefix}{op.name}'", op.type, "unread"))
      elif name not in seen:
        seen.add(name)
        found += _refused(root, body, body.get_operations(), f"{prefix}{op.name}/", seen)
    fix = None if by_type is not None else _fix(op)
    if fix is not None:
      found.append((f"'{prefix}{op.name}'", op.type, fix))
  return found


def _fix(op) -> str | None:
  """Why ``op`` is refused (a key of ``_FIX``), or ``None`` if it is allowed."""
  takes_resource = any(t.dtype == tf.resource for t in op.inputs)
  if not (op.op_def.is_stateful or takes_resource) or op.type in READS | CONTROL_FLOW:
    return None
  if op.type in FIXED_SIZE_DRAWS:
    size = tf.get_static_value(op.inputs[FIXED_SIZE_DRAWS[op.type]])
    return None if size is not None else "draw"
  return "generator" if op.type in _GENERATOR_OPS else "write"


def _called_functions(op) -> list[str]:
  """The functions ``op`` calls through its attributes (a call's ``f``, a loop's ``body``)."""
  names = []
  for attribute in _FUNCTION_ATTRIBUTES:
    try:
      value = op.get_attr(attribute)
    except ValueError:
      continue
    values = value if isinstance(value, list) else [value]
    names += [v.name for v in values if hasattr(v, "name")]
  return names


def _function_graph(graph, name: str):
  """The graph of function ``name``, looked up in ``graph`` and the graphs around it."""
  while graph is not None:
    function = graph._get_function(name)
    if function is not None:
      return getattr(function, "graph", None)
    graph = getattr(graph, "outer_graph", None)
  return None
