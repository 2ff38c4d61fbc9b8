"""Graph helpers shared by the tests that inspect a traced step's op order."""


def ancestors(op) -> set:
  """Every op ``op`` waits for: its inputs' and control inputs' ops, transitively."""
  seen, todo = set(), [op]
  while todo:
    current = todo.pop()
    for earlier in [tensor.op for tensor in current.inputs] + list(current.control_inputs):
      if earlier not in seen:
        seen.add(earlier)
        todo.append(earlier)
  return seen
