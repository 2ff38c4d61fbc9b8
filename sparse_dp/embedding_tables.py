"""Which variables are embedding tables: marked by ``sparse_dp.layers.Embedding``, read
by :class:`sparse_dp.optimizers.RowwiseAdagrad` (one accumulator per marked table row).

No TensorFlow import: the layer and the optimizer both import this mark, and
neither imports the other.
"""

# Set (True) on the table variable of every sparse_dp.layers.Embedding, and on each
# of its shards: the variables RowwiseAdagrad gives one accumulator per row.
_TABLE_MARK = "_sparse_dp_embedding_table"


def mark_embedding_table(table) -> None:
  """Marks ``table`` (a layer's table: a variable, a mirrored one, or a
  ``ShardedVariable`` and its shards) as an embedding table for :class:`RowwiseAdagrad`."""
  for variable in [table, *getattr(table, "variables", ())]:
    setattr(variable, _TABLE_MARK, True)


def is_embedding_table(variable) -> bool:
  """Whether ``variable`` was marked by :func:`mark_embedding_table`."""
  return getattr(variable, _TABLE_MARK, False) is True
