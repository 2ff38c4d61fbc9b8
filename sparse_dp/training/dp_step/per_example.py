"""Each example's loss and activation gradients, computed with that example alone.

The bound ``||G(D + z) - G(D)|| <= C2`` on the clipped sum ``G(D) = sum_i [g_i]_C2`` (Abadi et
al., CCS 2016; Ghazi et al., NeurIPS 2023, Algorithm 1) holds only if ``g_i`` is a function of
example ``i`` alone. Here it holds by construction, as JAX Privacy does with ``vmap``: the
model's forward and backward pass run on a batch of *one* example, once per example, with
``tf.vectorized_map`` over dense inputs and ``tf.map_fn`` where an input is ragged or sparse.
What leaves the per-example program is, per example ``i``: ``l_i``; each table's looked-up rows
and ``dl_i/d(looked-up vector)``; each ``Dense`` layer's inputs ``X_i`` and output gradients
``D_i = dl_i/dz``, whose product ``X_i^T D_i`` is never formed
(:mod:`sparse_dp.training.dp_step.dense_layers`). Every lookup and ``Dense`` call made while
computing ``l_i`` is charged to example ``i``; norms, clipping, the contribution map and the
noise follow in :mod:`sparse_dp.training.dp_step.step`. See docs/epsilon.md ("Each example
alone").
"""

from __future__ import annotations

import os
from typing import Callable, NamedTuple

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.layers.embedding import Embedding, leading_dimension
from sparse_dp.layers.recording import recording
from sparse_dp.mechanisms import RowGradients, per_example_row_gradients
from sparse_dp.mechanisms.rows import padding
from sparse_dp.mechanisms.rows.stacking import StackedTables
from sparse_dp.training.dp_step import dense_layers
from sparse_dp.training.dp_step.state_writes import forward_without_state_writes
from sparse_dp.training.dp_step.tracing import traced_as_written

LossesOf = Callable[[object], tuple]  # data -> (losses [B], labels or None, predictions or None)
"""A model's training-mode forward pass and loss on a batch.

``data -> (losses [B], labels or None, predictions or None)``.
"""


class PerExampleGradients(NamedTuple):
  """Per-example losses and gradients of one batch, by layer.

  Attributes:
    losses: ``[B]``, each example's loss ``l_i``.
    rows: every table's per-example row gradients in the stacked id space
      (:func:`stacked_tables`), or ``None`` without tables.
    lookups_per_example: per table, each example's lookups (an int), or ``None`` where the
      number is not fixed (ragged ids).
    dense: by ``Dense`` layer, ``(inputs [B, T, k], output gradients [B, T, n])``.
    ids_outside: by table, int64 ``[B]``: each example's ids outside the table's
      vocabulary (counted under XLA).
  """

  losses: tf.Tensor  # [B]
  rows: RowGradients  # every table's, stacked; None without tables
  lookups_per_example: list  # per table: each example's lookups (int), None if ragged
  dense: dict  # Dense -> (inputs [B, T, k], output gradients [B, T, n])
  ids_outside: dict  # Embedding -> int64 [B]: ids outside its vocabulary (counted under XLA)

  @property
  def batch_size(self) -> tf.Tensor:
    """``B``, the examples of the batch (padding rows included), as an int64 scalar."""
    return tf.shape(self.losses, out_type=tf.int64)[0]


@traced_as_written
def per_example_gradients(leaves: list, losses_of: LossesOf, data, in_batch=None,
                          loss_scale: float = 1.0, positions=None) -> PerExampleGradients:
  """``l_i``, each table's row gradients and each ``Dense`` layer's ``(X_i, D_i)``.

  Each example's forward and backward pass runs on a batch of that example alone. Tables
  and ``Dense`` layers of ``leaves`` that computing ``l_i`` did not use get no rows
  (``[B, 0, k]`` inputs).

  Args:
    leaves: the layers the DP step trains (``Dense`` and ``Embedding`` layers).
    losses_of: the model's forward pass and per-example losses; it is only ever called
      on a batch of one example.
    data (nest of tensors): the batch, of dense, ragged or sparse tensors.
    in_batch (tf.Tensor): ``[B]``, a padded batch's example mask
      (:mod:`sparse_dp.training.poisson.padded_batches`). The rows where it is false get
      loss 0, no lookups (row ``PAD``) and zero ``Dense`` parts.
    loss_scale: ``S``, the fixed loss scale of ``mixed_float16``
      (:mod:`sparse_dp.training.dp_step.mixed_precision`). The backward pass starts from
      ``S l_i``, and its gradients are divided by ``S`` in float32, so they are ``l_i``'s.
    positions (tf.Tensor): int64 ``[B]``, each example's position in the step's whole
      (local) batch, also for a micro-batch; ``range(B)`` by default. An embedding engine's
      lookups read an example's rows there
      (:func:`~sparse_dp.layers.recording.recorded_example`).

  Returns:
    The per-example losses and gradients, in float32 even when the layers compute in 16
      bits. A gradient that overflowed float16 stays non-finite: the step zeroes that
      example.

  Raises:
    ValueError: an example's loss is not one number, the forward pass writes state, or
      TensorFlow cannot run one of its operations per example.
  """
  tables, dense = _split(leaves)
  stacked = stacked_tables(tables)
  per_example_lookups = []

  def one_example(example, position) -> tuple:
    with tf.GradientTape() as tape:
      with recording(tape, position) as lookups, \
          dense_layers.recording_dense_calls(leaves) as calls:
        with forward_without_state_writes():
          losses, _, _ = losses_of(example)
      loss = _the_loss(losses)
      scaled = loss * loss_scale
    by_table, by_dense = lookups.by_layer(), _by_layer(calls)
    sources = ([[lookup.vectors for lookup in by_table.get(t, [])] for t in tables],
               [[c.preactivation for c in by_dense.get(d, [])] for d in dense])
    table_grads, dense_grads = tf.nest.map_structure(
        lambda g: tf.cast(g, tf.float32) / loss_scale,
        tape.gradient(scaled, sources,
                      unconnected_gradients=tf.UnconnectedGradients.ZERO))
    rows = [_rows(t, by_table.get(t, []), grads) for t, grads in zip(tables, table_grads)]
    dense_parts = [_tokens(d, by_dense.get(d, []), grads) for d, grads in zip(dense, dense_grads)]
    outside = [tf.add_n([tf.math.count_nonzero(lookup.outside, dtype=tf.int64)
                         for lookup in by_table.get(t, []) if lookup.outside is not None]
                        or [tf.constant(0, tf.int64)]) for t in tables]
    per_example_lookups[:] = [ids.shape[0] for ids, _ in rows]
    return loss, _stacked_rows(stacked, rows), dense_parts, _per_table(outside)

  loss, (ids, grads), dense_parts, outside = over_examples(
      one_example, data, _signature(stacked, dense), positions)
  batch_size = tf.shape(loss, out_type=tf.int64)[0]
  rows = None
  if stacked is not None:
    example, ids, grads = _flat(ids, grads, stacked.width)
    rows = per_example_row_gradients(example, _without_padding(example, ids, in_batch), grads,
                                     batch_size)
  by_dense = {layer: tuple(_masked(_dense(t, width), in_batch)
                           for t, width in zip(parts, (layer.kernel.shape[0], layer.units)))
              for layer, parts in zip(dense, dense_parts)}
  return PerExampleGradients(_masked(loss, in_batch), rows,
                             list(per_example_lookups),
                             by_dense, {t: _masked(outside[:, i], in_batch)
                                        for i, t in enumerate(tables)})


def stacked_tables(tables: list):
  """The tables laid end to end in one id space, in their order.

  Args:
    tables (list[sparse_dp.layers.Embedding]): the model's embedding layers.

  Returns:
    A :class:`~sparse_dp.mechanisms.rows.stacking.StackedTables` of their sizes and widths,
      or ``None`` without tables.
  """
  if not tables:
    return None
  return StackedTables([t.vocabulary_size for t in tables], [t.output_dim for t in tables])


def _stacked_rows(stacked, rows: list) -> tuple:
  """One example's lookups of every table and their gradients, in the stacked id space."""
  if stacked is None:
    return tf.zeros([0], tf.int64), tf.zeros([0, 0], tf.float32)
  return stacked.stack([ids for ids, _ in rows], [values for _, values in rows])


def _per_table(counts: list) -> tf.Tensor:
  return tf.stack(counts) if counts else tf.zeros([0], tf.int64)


class LookedUpRows(NamedTuple):
  """Every lookup of a batch, in the stacked id space of its tables (:func:`stacked_tables`).

  Attributes:
    example: int64 ``[n]``, the example of each lookup.
    row: int64 ``[n]``, its stacked row, or ``PAD`` (a padding example's).
    lookups_per_example: per table, each example's lookups (an int), or ``None`` where the
      number is not fixed (ragged ids).
  """

  example: tf.Tensor
  row: tf.Tensor
  lookups_per_example: list


def per_example_rows(leaves: list, losses_of: LossesOf, data, in_batch=None) -> LookedUpRows:
  """``(example, row)`` of every lookup each example makes: a forward pass only.

  Args:
    leaves: the layers the DP step trains; only the ``Embedding`` tables are read.
    losses_of: the model's forward pass, called on a batch of one example.
    data (nest of tensors): the batch, of dense, ragged or sparse tensors.
    in_batch (tf.Tensor): ``[B]``, a padded batch's example mask; rows where it is false
      look up nothing (row ``PAD``).

  Returns:
    The lookups of every table of ``leaves``, stacked.

  Raises:
    ValueError: the forward pass writes state, or TensorFlow cannot run one of its
      operations per example.
  """
  tables, _ = _split(leaves)
  stacked = stacked_tables(tables)
  per_example_lookups = []

  def one_example(example, position) -> tf.Tensor:
    with recording(example=position) as lookups, forward_without_state_writes():
      losses_of(example)
    by_table = lookups.by_layer()
    ids = [_concat([lookup.row for lookup in by_table.get(t, [])], tf.int64, []) for t in tables]
    per_example_lookups[:] = [i.shape[0] for i in ids]
    return stacked.stack_rows(ids)

  found = over_examples(one_example, data, _spec([None], tf.int64))
  example, ids, _ = _flat(found, None, stacked.width)
  return LookedUpRows(example, _without_padding(example, ids, in_batch),
                      list(per_example_lookups))


def _without_padding(example: tf.Tensor, ids: tf.Tensor, in_batch) -> tf.Tensor:
  """``ids`` with the lookups of the padding rows (``in_batch`` false) made ``PAD``."""
  if in_batch is None:
    return ids
  return tf.where(tf.gather(in_batch, example), ids, padding.PAD)


def _masked(values: tf.Tensor, in_batch) -> tf.Tensor:
  """``values [B, ...]`` with the padding rows (``in_batch`` false) set to zero."""
  return values if in_batch is None else padding.mask_rows(values, in_batch)


def _split(leaves: list) -> tuple[list, list]:
  return ([layer for layer in leaves if isinstance(layer, Embedding)],
          [layer for layer in leaves if isinstance(layer, keras.layers.Dense)])


def _by_layer(calls: list) -> dict:
  grouped: dict = {}
  for call in calls:
    grouped.setdefault(call.layer, []).append(call)
  return grouped


def _the_loss(losses) -> tf.Tensor:
  """The one example's loss as a float32 scalar."""
  losses = tf.convert_to_tensor(losses)
  if losses.shape.num_elements() != 1:
    raise ValueError(
        f"the per-example loss of one example has shape {losses.shape}; DP training needs "
        "one loss per example (a loss with reduction=keras.losses.Reduction.NONE, or a "
        "compute_loss that returns a [batch] tensor)")
  return tf.cast(tf.reshape(losses, []), tf.float32)


def _rows(table: Embedding, lookups: list, grads: list) -> tuple[tf.Tensor, tf.Tensor]:
  """Rows the example looked up in ``table`` and ``dl/d(vector)`` of each lookup."""
  ids = _concat([lookup.row for lookup in lookups], tf.int64, [])
  values = _concat([tf.reshape(g, [-1, table.output_dim]) for g in grads], tf.float32,
                   [table.output_dim])
  return ids, values


def _tokens(layer, calls: list, grads: list) -> tuple[tf.Tensor, tf.Tensor]:
  """Every row ``layer`` saw for this example, ``[T, k]``, and its output gradients ``[T, n]``."""
  k, n = layer.kernel.shape
  inputs = _concat([tf.reshape(tf.cast(c.inputs, tf.float32), [-1, k]) for c in calls],
                   tf.float32, [k])
  outputs = _concat([tf.reshape(g, [-1, n]) for g in grads], tf.float32, [n])
  return inputs, outputs


def _concat(parts: list, dtype, inner: list) -> tf.Tensor:
  return tf.concat(parts, 0) if parts else tf.zeros([0] + inner, dtype)


def _spec(shape: list, dtype) -> tf.RaggedTensorSpec:
  """A per-example output whose first dimension may differ between examples."""
  return tf.RaggedTensorSpec(shape, dtype, ragged_rank=0)


def _signature(stacked, dense: list) -> tuple:
  width, num_tables = (0, 0) if stacked is None else (stacked.width, stacked.num_tables)
  return (tf.TensorSpec([], tf.float32),
          (_spec([None], tf.int64), _spec([None, width], tf.float32)),
          [(_spec([None, d.kernel.shape[0]], tf.float32), _spec([None, d.units], tf.float32))
           for d in dense],
          tf.TensorSpec([num_tables], tf.int64))


def over_examples(fn, data, signature, positions=None):
  """``fn(batch of one example, its position)`` for each example, results stacked along a new
  first axis.

  Dense inputs: ``tf.vectorized_map`` (one batched program; an op it cannot
  vectorise runs in a loop). Ragged or sparse inputs: ``tf.map_fn``, whose
  per-example results may differ in length (ragged results). ``positions``: int64 ``[B]``,
  ``range(B)`` by default.
  """
  if tf.executing_eagerly():  # run_eagerly=True: the per-example program is still traced
    return tf.function(lambda data, positions: over_examples(fn, data, signature, positions),
                       autograph=False)(data, positions)
  parts = tf.nest.flatten(data, expand_composites=False)
  present = [p for p in parts if p is not None]
  composite = any(isinstance(p, (tf.RaggedTensor, tf.SparseTensor)) for p in present)
  if positions is None:
    positions = tf.range(_examples(present[0]), dtype=tf.int64)

  @traced_as_written  # tf.map_fn would convert it under a converted caller, fit's included
  def on_one(elements):
    *elements, position = elements
    elements = iter(elements)
    batch = [None if p is None else _batch_of_one(next(elements), p) for p in parts]
    return fn(tf.nest.pack_sequence_as(data, batch, expand_composites=False), position)

  if composite:
    return tf.map_fn(on_one, present + [positions], fn_output_signature=signature)
  # tf.vectorized_map cannot run on an empty batch, which a Poisson batch may
  # be: it runs on the batch and one spare example (a copy of the first, at its
  # position; zeros at position 0 in an empty batch, whose row 0 is no example),
  # whose results are cut off. (No branch on the batch size: XLA could not shape
  # its outputs.)
  with_spare = [_with_spare(p) for p in present + [positions]]
  return tf.nest.map_structure(lambda result: result[:-1], _vectorized(on_one, with_spare))


def _examples(part) -> tf.Tensor:
  """The number of examples of one part of a batch (dense, ragged or sparse)."""
  if isinstance(part, tf.RaggedTensor):
    return part.nrows(out_type=tf.int64)
  if isinstance(part, tf.SparseTensor):
    return part.dense_shape[0]
  return leading_dimension(part)


def _with_spare(batch: tf.Tensor) -> tf.Tensor:
  """``batch`` and one spare example after it: a copy of its first, zeros when it is empty.

  The spare is the first row of ``batch[:1]`` padded with one example of zeros (of ``""``
  for strings).
  """
  if batch.shape.rank is not None:
    one_after = [[0, 1]] + [[0, 0]] * (batch.shape.rank - 1)
  else:
    one_after = tf.pad([[0, 1]], [[0, tf.rank(batch) - 1], [0, 0]])
  return tf.concat([batch, tf.pad(batch[:1], one_after)[:1]], 0)


def _vectorized(fn, elements):
  try:
    return tf.vectorized_map(fn, elements, fallback_to_while_loop=True)
  except (ValueError, TypeError, NotImplementedError) as error:
    if not _raised_converting(error):
      raise
    raise ValueError(
        "sparse-dp: the DP step runs each example's forward pass alone under "
        "tf.vectorized_map, and TensorFlow could not convert an operation of this model's "
        "forward pass or loss for it (see the error above). Operations that write state "
        "(assigning a variable, inserting into a lookup table) cannot run in the DP step: "
        "their state would be released without noise; compute the value per example, or "
        "move the stateful operation out of the model's call and loss") from error


def _raised_converting(error: Exception) -> bool:
  """Whether ``error`` came from TensorFlow's parallel-for converter, not from the model.

  An error of the model or its loss is raised under the per-example function,
  which parallel-for calls; a conversion error is raised by TensorFlow's own
  code after the last parallel-for frame.
  """
  files, frame = [], error.__traceback__
  while frame is not None:
    files.append(frame.tb_frame.f_code.co_filename)
    frame = frame.tb_next
  converter = [i for i, name in enumerate(files) if "parallel_for" in name]
  return bool(converter) and all(f"{os.sep}tensorflow{os.sep}" in name
                                 for name in files[converter[-1] + 1:])


def _batch_of_one(element, batch):
  """Example ``element`` of ``batch`` as a batch of one: ``[...] -> [1, ...]``, of its kind."""
  if isinstance(element, tf.SparseTensor):
    return tf.sparse.expand_dims(element, 0)
  if isinstance(element, tf.RaggedTensor):
    return tf.expand_dims(element, 0)
  if isinstance(batch, tf.RaggedTensor):  # a row of a [B, None, ...] ragged batch
    return tf.RaggedTensor.from_tensor(element[None])
  return element[None]


def _flat(ids, values, width: int) -> tuple:
  """Stacked per-example ids ``[B, L]`` (and values ``[B, L, d]``), flat, with example indices."""
  if isinstance(ids, tf.RaggedTensor):
    example = ids.value_rowids()
    return (example, ids.flat_values,
            None if values is None else tf.reshape(values.flat_values, [-1, width]))
  batch, length = tf.shape(ids, out_type=tf.int64)[0], tf.shape(ids, out_type=tf.int64)[1]
  example = tf.repeat(tf.range(batch), length)
  return (example, tf.reshape(ids, [-1]),
          None if values is None else tf.reshape(values, [-1, width]))


def _dense(stacked, width: int) -> tf.Tensor:
  """Per-example ``[B, T, width]`` from stacked (or ragged, padded with zeros) tokens."""
  if isinstance(stacked, tf.RaggedTensor):
    stacked = stacked.to_tensor()
  if stacked.shape.rank == 3 and stacked.shape[-1] == width:  # as stacked, most often
    return stacked
  return tf.reshape(stacked, [tf.shape(stacked)[0], -1, width])


__all__ = ["LookedUpRows", "LossesOf", "PerExampleGradients", "per_example_gradients",
           "per_example_rows", "stacked_tables"]
