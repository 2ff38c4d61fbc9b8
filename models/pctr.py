"""The Criteo pCTR model of Ghazi et al. (NeurIPS 2023, App. D.1.1).

One embedding table per categorical feature, of dimension ``int(2 V^0.25)``
for a vocabulary of ``V`` rows; the embeddings are concatenated with the
log-transformed integer features and go through four ReLU layers of 598 units
and one logit. Built on :class:`sparse_dp.layers.Embedding`, so every
algorithm of sparse-dp can train it. ``hashed_rows`` makes a compact variant (a
distillation student, :mod:`sparse_dp.jobs.distill`): feature ``i``'s ids are
hashed (Keras ``Hashing``, FarmHash) into ``hashed_rows[i]`` rows before the lookup.
"""

from __future__ import annotations

from typing import Optional, Sequence

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.data.criteo_format import NUM_INTEGER
from sparse_dp.layers import Embedding

HIDDEN_UNITS = (598, 598, 598, 598)


def embedding_dim(vocabulary_size: int) -> int:
  """``int(2 V^0.25)``, the paper's heuristic."""
  return int(2 * vocabulary_size ** 0.25)


def build_pctr_model(vocabulary_sizes: Sequence[int],
                     hidden_units: Sequence[int] = HIDDEN_UNITS,
                     embedding_dims: Optional[Sequence[int]] = None,
                     hashed_rows: Optional[Sequence[int]] = None,
                     table_placement: str = "default_device") -> keras.Model:
  """Inputs ``{"integers": [B, 13] float32, "categorical": [B, 26] int64}``; output a logit.

  ``embedding_dims`` defaults to :func:`embedding_dim` of each table's rows
  (DP-FEST passes the dims of the tables before preselection, so that
  algorithms compare on one architecture). ``hashed_rows``: rows of each table,
  the ids of ``vocabulary_sizes[i]`` hashed into them (default: one row per id).
  ``table_placement``: the tables' (:class:`~sparse_dp.layers.Embedding`);
  ``"host"`` for tables the TPU embedding engine trains.
  """
  rows = list(vocabulary_sizes if hashed_rows is None else hashed_rows)
  if len(rows) != len(vocabulary_sizes) or min(rows) < 1:
    raise ValueError(f"hashed_rows must give {len(vocabulary_sizes)} positive row counts, "
                     f"got {hashed_rows}")
  if embedding_dims is None:
    embedding_dims = [embedding_dim(size) for size in rows]
  integers = keras.Input(shape=(NUM_INTEGER,), dtype=tf.float32, name="integers")
  categorical = keras.Input(shape=(len(vocabulary_sizes),), dtype=tf.int64,
                               name="categorical")
  # One op for all columns: 26 slices were 26 Keras layers, each traced and vectorised in
  # the DP step's per-example program (1.2 s of its 5.7 s trace).
  columns = tf.unstack(categorical, axis=1)
  ids = [column if hashed_rows is None else
         keras.layers.Hashing(size, name=f"hashing_{i}")(column)
         for i, (column, size) in enumerate(zip(columns, rows))]
  embedded = [Embedding(size, dim, name=f"embedding_{i}", table_placement=table_placement)(ids[i])
              for i, (size, dim) in enumerate(zip(rows, embedding_dims))]
  hidden = keras.layers.Concatenate()(embedded + [integers])
  for i, units in enumerate(hidden_units):
    hidden = keras.layers.Dense(units, activation="relu", name=f"hidden_{i}")(hidden)
  logit = keras.layers.Dense(1, name="logit")(hidden)
  return keras.Model({"integers": integers, "categorical": categorical}, logit, name="pctr")


def table_ids(x: dict) -> dict:
  """Each table's ids in a batch's features ``x``, by layer name (``TPUTrainer``'s ``input_ids``).

  For a model without ``hashed_rows``, whose table ``i`` looks up column ``i``
  of ``categorical``.
  """
  categorical = x["categorical"]
  return {f"embedding_{i}": categorical[:, i] for i in range(categorical.shape[1])}


def save_model(model: keras.Model, path, include_optimizer: bool = True) -> None:
  """Writes ``model`` as a SavedModel: its layers' configs, weights, DP record and serving
  signature.

  Keras's default (``save_traces=True``) also traces every layer's call into the file, about
  half the save's seconds for 26 tables; ``keras.models.load_model`` rebuilds these models
  from their configs instead. The ``serving_default`` signature is the one Keras writes:
  the model's inference call on its inputs, each output named after its layer
  (``{"logit": [B, 1]}``).

  Args:
    model: a model that knows its inputs (a functional one, e.g. :func:`build_pctr_model`'s).
    path: the SavedModel's folder.
    include_optimizer: whether to save the optimizer's state too.

  Raises:
    ValueError: the model has no inputs yet (a subclassed model never called).
  """
  spec = model.save_spec()
  if spec is None:
    raise ValueError(f"model '{model.name}' has no inputs yet: call it on a batch (or fit it) "
                     "before saving it")
  args, kwargs = spec

  @tf.function
  def serving_default(*inputs, **named_inputs):
    outputs = model(*inputs, training=False, **named_inputs)
    return dict(zip(model.output_names, tf.nest.flatten(outputs)))

  model.save(path, include_optimizer=include_optimizer, save_traces=False,
             signatures=serving_default.get_concrete_function(*args, **kwargs))
