"""One DP gradient: clip, select rows, add noise (Ghazi et al., NeurIPS 2023, Algorithm 1).

For a batch with per-example losses ``l_i``:

1. one forward and one backward pass give the per-example gradients of all weights (through
   ``dL/d(looked-up vectors)`` and each Dense layer's ``dL/dz``, never materialised as such);
2. for DP-AdaFEST, the clipped contribution map (``C1``) is noised (``sigma1 C1``) and
   thresholded at ``tau``; rows that do not pass are zeroed (lines 6-8);
3. each example's gradient is clipped jointly over all weights to ``C2``;
4. Gaussian noise ``sigma2 C2`` (``sigma C2`` for DP-SGD) goes on the dense weights and on
   the selected rows only (DP-AdaFEST) or on every row (DP-SGD); the noisy sum is divided by
   the *expected* batch size, as the accounting assumes.

Replicas, micro-batches and why the step is built so: docs/epsilon.md ("Inside the DP step").
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import tensorflow as tf

from sparse_dp import mechanisms
from sparse_dp.distribute import shards
from sparse_dp.layers.embedding import Embedding
from sparse_dp.mechanisms.rows.scans import compiling_with_xla
from sparse_dp.training.dp_step import dense_layers
from sparse_dp.training.dp_step.per_example import (
  LossesOf,
  PerExampleGradients,
  per_example_gradients,
  per_example_rows,
  stacked_tables,
)
from sparse_dp.training.dp_step.tracing import traced_as_written

# The step's flags, which the host guards (:mod:`sparse_dp.training.wrappers.host_guards`)
# refuse outside the compiled program.
# Log key prefix of a compiled step's flag (1.0) that some id of a table's lookups was
# outside its vocabulary: a flag, not the count, and for the host guards only, which
# refuse the step and must pop it from the logs (it is an un-noised statistic of the batch).
IDS_OUTSIDE = "sparse_dp_ids_outside_vocabulary"
# Log key of a compiled step's count of tables whose rows a false-positive overflow cut
# (mechanisms.selection.table_selection).
OVER_CAPACITY = "sparse_dp_false_positives_over_capacity"
# Why a step whose false positives overflowed their room is refused (graph mode and XLA).
OVER_CAPACITY_MESSAGE = (
    "sparse-dp: false positives overflowed the room made for them (an event of probability "
    "<= 1e-18 per table and step, and as much for all tables' room together: "
    "mechanisms.selection.row_selection.FALSE_POSITIVE_OVERFLOW); training stops rather than "
    "go on from a selection that is not the accounted mechanism's")


@dataclasses.dataclass(frozen=True)
class StepNoise:
  """Noise of one step, resolved from the config (calibrated if needed)."""

  gradient_multiplier: float  # sigma (DP-SGD, DP-FEST) or sigma2 (DP-AdaFEST)
  contribution_multiplier: Optional[float]  # sigma1 for DP-AdaFEST; None: dense noise
  l2_norm_clip: float  # C2
  contribution_clip: float  # C1
  threshold: float  # tau
  expected_batch_size: float
  dense_tables: frozenset = frozenset()  # DP-AdaFEST: names of the tables noised on every row

  @property
  def sparse(self) -> bool:
    return self.contribution_multiplier is not None


@dataclasses.dataclass
class _ClippedSums:
  """``sum_i [g_i]_C2`` per variable: every table's in the stacked id space."""

  tables: Optional[tuple]  # (rows, values [n, D]): a padded list of stacked rows, their sums
  dense: dict  # variable ref -> tf.Tensor
  non_finite: tf.Tensor  # int64: examples whose gradient was zeroed (un-noised: debug only)


@dataclasses.dataclass
class _Tables:
  """The step's tables: stacked in one id space, with the lookups of a batch."""

  layers: list  # the Embedding layers of leaves, in order
  stacked: mechanisms.StackedTables
  lookups_per_example: list  # per table, each example's lookups (int), None if ragged
  batch_size: Optional[tf.Tensor] = None  # the examples whose lookups a stacked list holds

  def rooms(self, sizes: list, replicas: int = 1, dense: tuple = ()):
    """Per table, lengths ``R B lookups_per_example + sizes`` for its part of a stacked list
    under XLA (constants once XLA knows the batch's shape), or its vocabulary where ``dense``
    flags it (every row); ``None`` (exact parts) in graph mode. ``replicas``: ``R``, the
    replicas whose lookups the list holds (the selection's: every replica's; a replica's own
    sums: 1)."""
    if not compiling_with_xla():
      return None
    if any(count is None for count in self.lookups_per_example):
      raise ValueError("sparse-dp: under XLA (jit_compile=True) the DP step needs each "
                       "example's lookups of a table to be fixed in number: feed "
                       "private.poisson_dataset(..., padded=True) of dense tensors")
    batch_size = tf.cast(self.batch_size, tf.int64) * replicas
    dense = dense or (False,) * len(sizes)
    return [tf.constant(layer.vocabulary_size, tf.int64) if whole else batch_size * count + size
            for layer, count, size, whole in zip(self.layers, self.lookups_per_example, sizes,
                                                 dense)]

  def dense(self, noise: StepNoise) -> tuple:
    """Per table, whether ``noise`` noises it on every row (a dense table of DP-AdaFEST)."""
    return tuple(layer.name in noise.dense_tables for layer in self.layers)


@traced_as_written
def private_gradients(leaves: list, losses_of: LossesOf, data, noise: StepNoise,
                      seed: tf.Tensor, microbatch_size: Optional[int] = None,
                      on_outputs: Optional[Callable] = None, *,
                      debug_metrics: bool = False, in_batch: Optional[tf.Tensor] = None,
                      loss_scale: float = 1.0):
  """Noisy, clipped gradients of every weight of ``leaves``, and step statistics.

  ``losses_of(batch)`` runs the model forward on a batch and returns its
  per-example losses ``[B]``, with labels and predictions (or ``None``s). The
  gradients come from :func:`~sparse_dp.training.dp_step.per_example.per_example_gradients`,
  which calls ``losses_of`` on each example alone, so each example's clipped
  gradient depends on that example only, whatever the model does.
  ``on_outputs(labels, predictions, weights)`` (Keras metric updates, with
  ``debug_metrics`` only) is called once with a plain forward pass of the
  whole batch. ``in_batch``: the example mask of a padded batch
  (:mod:`sparse_dp.training.poisson.padded_batches`); its padding rows weigh nothing
  anywhere. ``loss_scale``: the fixed loss scale of mixed precision
  (:mod:`sparse_dp.training.dp_step.mixed_precision`). Returns ``(gradients by
  variable ref, per-example losses, statistics)``.

  Every table is handled in one stacked id space (:mod:`sparse_dp.mechanisms.rows.stacking`):
  one row list, one sort, one selection and one noise draw for all tables, split into each
  table's update at the end.

  The statistics are DP by default (see :func:`_add_noise`); with
  ``debug_metrics`` they add un-noised ones that the epsilon does not cover.
  """
  layers = [layer for layer in leaves if isinstance(layer, Embedding)]
  stacked = stacked_tables(layers)
  selection_seed, noise_seed = mechanisms.split(seed, 2)
  selection = None
  if microbatch_size is None:
    recorded = per_example_gradients(leaves, losses_of, data, in_batch, loss_scale)
    tables = _Tables(layers, stacked, recorded.lookups_per_example, recorded.batch_size)
    if noise.sparse and layers:
      selection = _select_rows(stacked, recorded.rows.example, recorded.rows.row,
                               recorded.batch_size, noise, selection_seed, tables.dense(noise),
                               distinct=True)
    sums, losses = _clipped_sums(leaves, recorded, selection, noise), recorded.losses
    ids_outside = {layer: tf.reduce_sum(count) for layer, count in recorded.ids_outside.items()}
  else:
    chunks = _Chunks(data, microbatch_size, in_batch)
    tables = _Tables(layers, stacked, [None] * len(layers), chunks.batch_size)
    if noise.sparse and layers:
      found = per_example_rows(leaves, losses_of, data, in_batch)
      tables.lookups_per_example = found.lookups_per_example
      selection = _select_rows(stacked, found.example, found.row, chunks.batch_size, noise,
                               selection_seed, tables.dense(noise))
    sums, losses, ids_outside, lookups = _accumulated_clipped_sums(
        leaves, losses_of, chunks, selection, noise, loss_scale)
    if selection is None:  # the dense noise's parts: the micro-batches' lookups
      tables.lookups_per_example = lookups
      tables.batch_size = tf.cast(chunks.count, tf.int64) * chunks.size
  if on_outputs is not None:
    _, labels, predictions = losses_of(data)
    if labels is not None:
      on_outputs(labels, predictions, None if in_batch is None else tf.cast(in_batch, tf.float32))
  over_capacity = rooms = None
  if selection is not None:
    rooms = tables.rooms(mechanisms.false_positive_rooms(
        stacked.sizes, noise.threshold, noise.contribution_multiplier * noise.contribution_clip),
        _replicas(), tables.dense(noise))  # the selection is the whole batch's
    over_capacity = selection.over_capacity(rooms)
  with tf.control_dependencies(_refuse_over_capacity(over_capacity)):
    gradients, stats = _add_noise(leaves, tables, sums, selection, rooms, noise, noise_seed,
                                  debug_metrics)
  if compiling_with_xla():  # for the host's refusals (host_guards)
    if over_capacity is not None:
      stats[OVER_CAPACITY] = tf.reduce_sum(tf.cast(over_capacity, tf.float32))
    stats.update({f"{IDS_OUTSIDE}/{layer.name}": tf.cast(count > 0, tf.float32)
                  for layer, count in ids_outside.items()})
  return gradients, losses, stats


def _refuse_over_capacity(over_capacity: Optional[tf.Tensor]) -> list:
  """Asserts that no table's false positives overflowed their room (before the noise).

  The overflow has probability ``<= FALSE_POSITIVE_OVERFLOW`` (``1e-18``) per
  table and step, and as much for the tables' room together
  (:mod:`~sparse_dp.mechanisms.selection.table_selection`); the selection past
  it would not be the accounted mechanism's.
  XLA compiles the assert away: a compiled step logs the overflow instead
  (:data:`OVER_CAPACITY`) for the host guards to refuse.
  """
  if over_capacity is None:
    return []
  return [tf.debugging.Assert(tf.logical_not(tf.reduce_any(over_capacity)),
                              [OVER_CAPACITY_MESSAGE])]


def _select_rows(stacked, example, row, batch_size, noise: StepNoise, seed, dense: tuple,
                 distinct: bool = False):
  """Every table's selected rows, from the contribution map of the whole batch.

  ``(example, row)`` lists the batch's lookups in the stacked id space (``distinct``: the
  distinct pairs, sorted, as the per-example row gradients hold them). One selection for all
  tables (:func:`~sparse_dp.mechanisms.select_stacked_rows`); every row of a ``dense`` one.
  """
  replicas = _replicas()
  if replicas > 1:
    (example, row), batch_size = _gather_across_replicas((example, row), batch_size)
  return mechanisms.select_stacked_rows(
      example, row, stacked, batch_size, noise.contribution_clip, noise.threshold,
      noise.contribution_multiplier * noise.contribution_clip, seed,
      distinct=distinct and replicas == 1, dense=dense)  # replicas' lists: not sorted


def _replicas() -> int:
  """The replicas in sync in the current replica context (1 outside one)."""
  context = tf.distribute.get_replica_context()
  return 1 if context is None else context.num_replicas_in_sync


def _gather_across_replicas(pairs, batch_size):
  """All replicas' ``(example, row)`` pairs, examples numbered across replicas.

  ``batch_size``: this replica's example slots (padding rows included). Replica ``r``'s
  examples follow the slots of replicas ``0..r-1``. Under XLA a TPU compiles one program for
  all replicas, so every replica has this one's static slots and lookups (padded batches split
  evenly: ``batch_capacity``): the offset is ``r`` times the slots (``r`` is a value of the
  running program, never a shape) and no length is exchanged. In graph mode the replicas'
  slots are exchanged and lists of different lengths padded (row ``PAD``) to the longest.
  """
  context = tf.distribute.get_replica_context()
  replicas, replica = context.num_replicas_in_sync, context.replica_id_in_sync_group
  example, row = pairs
  if compiling_with_xla():
    if row.shape[0] is None:
      raise ValueError(
          "sparse-dp: under XLA on several replicas each replica's batch must have one static "
          "size, for one program compiled for all: feed private.poisson_dataset(..., "
          "padded=True), whose capacity is a multiple of the model's strategy's replicas")
    # Exchanged in int32, which a TPU's all-gather takes natively (an int64 one goes through
    # all_to_all): the examples numbered across replicas (below R B), the rows as two words.
    example = tf.cast(example + tf.cast(replica, tf.int64) * batch_size, tf.int32)
    words = context.all_gather(tf.bitcast(row, tf.int32), axis=0)
    return ((tf.cast(context.all_gather(example, axis=0), tf.int64), tf.bitcast(words, tf.int64)),
            batch_size * replicas)
  sizes = context.all_gather(batch_size[None], axis=0)
  example += tf.reduce_sum(sizes[:replica])
  length = tf.shape(row, out_type=tf.int64)[0]
  missing = tf.reduce_max(context.all_gather(length[None], axis=0)) - length
  row = tf.pad(row, [[0, missing]], constant_values=mechanisms.PAD)
  example = tf.pad(example, [[0, missing]])
  return ((context.all_gather(example, axis=0), context.all_gather(row, axis=0)),
          tf.reduce_sum(sizes))


def _clipped_sums(leaves, recorded: PerExampleGradients, selection,
                  noise: StepNoise) -> _ClippedSums:
  """Masks to the selected rows, zeroes non-finite examples, clips each jointly to ``C2``, sums.

  An example whose loss or gradient is not finite (a NaN input, a mean over no
  tokens: 0/0) would make the sum NaN: clipping does not bound NaN, and
  whether the released model is finite would tell whether the example was in
  the batch. Its gradient is set to zero before clipping, so the clipped sum
  is exactly the sum without it, as if it had not been sampled; the bound
  ``||G(D + z) - G(D)|| <= C2`` holds with or without it.
  """
  rows = recorded.rows
  if rows is not None and selection is not None:
    rows = mechanisms.restrict_to_rows(rows, selection.rows, sorted_rows=True)
  batch_size = recorded.batch_size
  squared = [tf.zeros([batch_size])]
  if rows is not None:
    squared.append(mechanisms.squared_norms(rows, batch_size))
  squared += [dense_layers.squared_norms(x, d, layer.use_bias)
              for layer, (x, d) in recorded.dense.items()]
  total = tf.add_n(squared)
  finite = tf.logical_and(tf.math.is_finite(total), tf.math.is_finite(recorded.losses))
  dense = {layer: tuple(tf.where(finite[:, None, None], t, tf.zeros_like(t)) for t in parts)
           for layer, parts in recorded.dense.items()}
  factors = mechanisms.clip_factors(tf.where(finite, total, tf.zeros_like(total)),
                                    noise.l2_norm_clip)
  non_finite = tf.math.count_nonzero(tf.logical_not(finite), dtype=tf.int64)
  table_sums = None
  if rows is not None:
    table_sums = mechanisms.clipped_rows(mechanisms.zero_examples(rows, finite), factors)
  sums = _ClippedSums(table_sums, {}, non_finite)
  for layer in leaves:
    if isinstance(layer, Embedding):
      continue
    if layer in dense:
      kernel, bias = dense_layers.clipped_sums(*dense[layer], factors, layer.use_bias)
    else:  # not called: its clipped sum is zero
      kernel = tf.zeros_like(layer.kernel)
      bias = tf.zeros_like(layer.bias) if layer.use_bias else None
    sums.dense[layer.kernel.ref()] = kernel
    if bias is not None:
      sums.dense[layer.bias.ref()] = bias
  return sums


class _Chunks:
  """Micro-batches ``[i m, (i + 1) m)`` of a batch of tensors or ragged tensors, their masks
  and their examples' positions in the batch.

  Under XLA every shape must be static: the batch (a padded one, of static
  size ``C``) is padded on to ``ceil(C / m) m`` rows with copies of its first
  example outside ``in_batch`` (loss 0, no lookups, a zero gradient, as in
  :mod:`~sparse_dp.training.poisson.padded_batches`), so that every micro-batch has
  ``m`` rows and there are ``ceil(C / m)`` of them.
  """

  def __init__(self, data, size: int, in_batch: Optional[tf.Tensor] = None):
    if not isinstance(size, int) or size < 1:
      raise ValueError(f"microbatch_size must be an integer >= 1, got {size!r}")
    first = tf.nest.flatten(data, expand_composites=False)[0]
    self.batch_size = tf.cast(first.nrows() if isinstance(first, tf.RaggedTensor)
                              else tf.shape(first)[0], tf.int64)
    self.static = compiling_with_xla()
    if self.static:
      rows = None if isinstance(first, tf.RaggedTensor) else first.shape[0]
      if rows is None:
        raise ValueError(
            "microbatch_size under XLA (jit_compile=True) needs batches of one static size: "
            "feed private.poisson_dataset(..., padded=True) of dense tensors")
      count = -(-rows // size)
      extra = count * size - rows
      in_batch = tf.ones([rows], tf.bool) if in_batch is None else in_batch
      data = tf.nest.map_structure(
          lambda t: tf.concat([t, tf.repeat(t[:1], extra, axis=0)], 0), data)
      in_batch = tf.concat([in_batch, tf.zeros([extra], tf.bool)], 0)
      # each row's position in the batch: the added copies are row 0's
      self.positions = tf.concat([tf.range(rows, dtype=tf.int64), tf.zeros([extra], tf.int64)],
                                 0)
      self.count, self.rows = count, rows
    else:
      self.count = (self.batch_size + size - 1) // size
    self.data, self.size, self.in_batch = data, size, in_batch

  def start(self, index):
    return tf.cast(index, tf.int64) * self.size

  def __getitem__(self, index):
    """Micro-batch ``index``, its example mask (``None`` for an unpadded batch) and its
    examples' positions in the batch."""
    start = self.start(index)
    if self.static:  # m rows from a run-time start: a gather of static size
      rows = start + tf.range(self.size, dtype=tf.int64)
      return (tf.nest.map_structure(lambda t: tf.gather(t, rows), self.data),
              tf.gather(self.in_batch, rows), tf.gather(self.positions, rows))
    end = tf.minimum(start + self.size, self.batch_size)
    chunk = tf.nest.map_structure(lambda t: t[start:end], self.data)
    return (chunk, None if self.in_batch is None else self.in_batch[start:end],
            tf.range(start, end))

  def array(self, dtype, element_shape) -> tf.TensorArray:
    """One entry per micro-batch: ``count`` fixed under XLA, growing in graph mode."""
    if self.static:
      return tf.TensorArray(dtype, size=self.count, element_shape=tf.TensorShape(element_shape))
    return tf.TensorArray(dtype, size=0, dynamic_size=True, infer_shape=False,
                          element_shape=tf.TensorShape(element_shape))


def _accumulated_clipped_sums(leaves, losses_of, chunks: _Chunks, selection, noise,
                              loss_scale: float):
  """:func:`_clipped_sums` of every micro-batch, added up; the per-example losses; the ids
  outside each table's vocabulary (counted under XLA); and each table's lookups per example
  (``None`` for ragged ids)."""
  tables = [layer for layer in leaves if isinstance(layer, Embedding)]
  width = max([layer.output_dim for layer in tables], default=0)
  dense_refs = [ref for layer in leaves if not isinstance(layer, Embedding)
                for ref in ([layer.kernel.ref()] + ([layer.bias.ref()] if layer.use_bias else []))]

  chunk_lookups = [None] * len(tables)

  def body(index, dense, table_rows, table_values, losses, non_finite, outside):
    chunk, in_batch, positions = chunks[index]
    recorded = per_example_gradients(leaves, losses_of, chunk, in_batch, loss_scale, positions)
    chunk_lookups[:] = recorded.lookups_per_example
    sums = _clipped_sums(leaves, recorded, selection, noise)
    dense = [total + sums.dense[ref] for total, ref in zip(dense, dense_refs)]
    if sums.tables is not None:
      table_rows = table_rows.write(index, sums.tables[0])
      table_values = table_values.write(index, sums.tables[1])
    outside = [total + tf.reduce_sum(recorded.ids_outside[layer])
               for layer, total in zip(tables, outside)]
    return (index + 1, dense, table_rows, table_values, losses.write(index, recorded.losses),
            non_finite + sums.non_finite, outside)

  zero = tf.constant(0, tf.int64)
  start = (tf.constant(0), [tf.zeros(ref.deref().shape, ref.deref().dtype) for ref in dense_refs],
           chunks.array(tf.int64, [None]), chunks.array(tf.float32, [None, width]),
           chunks.array(tf.float32, [None]), zero, [zero for _ in tables])
  _, dense, table_rows, table_values, losses, non_finite, outside = tf.while_loop(
      lambda index, *_: tf.cast(index, tf.int64) < tf.cast(chunks.count, tf.int64), body, start,
      maximum_iterations=chunks.count if chunks.static else None)
  # The micro-batches' rows repeat: summed per distinct row, as one batch's are.
  table_sums = (mechanisms.sum_by_row(table_rows.concat(), table_values.concat()) if tables
                else None)
  sums = _ClippedSums(table_sums, dict(zip(dense_refs, dense)), non_finite)
  losses = losses.concat()
  return (sums, losses[:chunks.rows] if chunks.static else losses, dict(zip(tables, outside)),
          list(chunk_lookups))


def _add_noise(leaves, tables: _Tables, sums: _ClippedSums, selection, rooms,
               noise: StepNoise, seed, debug_metrics: bool = False):
  """Clipped sums plus noise, divided by the expected batch size, per variable; ``rooms``:
  each table's part of the selection under XLA (``None`` in graph mode)."""
  context = tf.distribute.get_replica_context()
  adds_noise = 1.0 if context is None else tf.cast(
      tf.equal(context.replica_id_in_sync_group, 0), tf.float32)
  std = noise.gradient_multiplier * noise.l2_norm_clip
  seeds = mechanisms.split(seed, 2 * len(leaves))
  gradients, signal, noise_squared = {}, [], []
  squared_norms = {}  # gradient key -> the squared norm of a gradient read before the update
  nonzero_rows = nonzero_coordinates = tf.constant(0, tf.int64)
  stacked = tables.stacked

  first_table = next((i for i, layer in enumerate(leaves) if isinstance(layer, Embedding)), None)
  if first_table is not None and noise.sparse:  # DP-AdaFEST: noise on the selected rows only
    rows = selection.rows
    kept = mechanisms.sum_on_rows(tf.IndexedSlices(sums.tables[1], sums.tables[0]), rows,
                                  sorted_indices=True)
    draw = mechanisms.row_sparse_noise(rows, kept, std * adds_noise, seeds[2 * first_table],
                                       stacked.coordinate_mask(rows))
    if debug_metrics:
      signal.append(tf.reduce_sum(tf.square(kept)))
      noise_squared.append(tf.reduce_sum(tf.square(draw)))
    parts = stacked.split(rows, (kept + draw) / noise.expected_batch_size, rooms)
    for layer, (table_rows, values) in zip(tables.layers, parts):
      gradients[shards.gradient_key(layer.embeddings)] = tf.IndexedSlices(
          values, table_rows, tf.constant([layer.vocabulary_size, layer.output_dim], tf.int64))
    selected = selection.num_rows
    nonzero_rows = tf.reduce_sum(selected)
    nonzero_coordinates = tf.reduce_sum(selected * tf.constant(stacked.widths, tf.int64))
  elif first_table is not None:  # DP-SGD: noise on every row; the clipped rows are added to it
    previous_dense = []  # the last table's noisy gradient
    parts = stacked.split(*sums.tables, rooms=tables.rooms([0] * len(tables.layers)))
    for layer, (table_rows, values) in zip(tables.layers, parts):
      i = leaves.index(layer)
      clipped = tf.IndexedSlices(values, mechanisms.safe_rows(table_rows),
                                 tf.constant([layer.vocabulary_size, layer.output_dim], tf.int64))
      # The draw depends on its seed only, so it could run before the backward pass
      # and every table's would be held at once (the size of all tables). It waits
      # for this table's clipped sum and for the previous table's noisy gradient: one
      # table's dense noise at a time (on a large table, one chunk of it at a time:
      # mechanisms.noise.dense_noise), made in place (each temporary has one reader).
      noisy = mechanisms.add_dense_noise(
          clipped, (layer.vocabulary_size, layer.output_dim), std * adds_noise, seeds[2 * i],
          after=[clipped.values, *previous_dense])
      if debug_metrics:
        signal.append(tf.reduce_sum(tf.square(clipped.values)))
        noise_squared.append(noisy.noise_squared)
      key = shards.gradient_key(layer.embeddings)
      gradient = _divided(noisy.sum, noise.expected_batch_size)
      if isinstance(gradient, tf.IndexedSlices):  # a large table's, over every row
        gradient, squared_norms[key] = _read_before_update(gradient)
      previous_dense = [gradient.values if isinstance(gradient, tf.IndexedSlices) else gradient]
      gradients[key] = gradient
    nonzero_rows = tf.constant(stacked.num_rows, tf.int64)
    nonzero_coordinates = tf.constant(
        sum(size * width for size, width in zip(stacked.sizes, stacked.widths)), tf.int64)
  first_dense = next((i for i, layer in enumerate(leaves) if not isinstance(layer, Embedding)),
                     None)
  if first_dense is not None and sums.dense:  # a table's seed is its own leaf's: no table's
    noisy, draw = _noised_dense_weights(sums.dense, std * adds_noise, seeds[2 * first_dense],
                                        noise.expected_batch_size)
    gradients.update(noisy)
    if debug_metrics:
      signal.append(tf.add_n([tf.reduce_sum(tf.square(c)) for c in sums.dense.values()]))
      noise_squared.append(tf.reduce_sum(tf.square(draw)))

  table_rows = stacked.num_rows if stacked is not None else 0
  stats = {
      "nonzero_rows": tf.cast(nonzero_rows, tf.float32),
      "nonzero_coordinates": tf.cast(nonzero_coordinates, tf.float32),
      "gradient_size_reduction": table_rows / tf.maximum(tf.cast(nonzero_rows, tf.float32), 1.0),
      "noisy_gradient_norm": _norm([g for key, g in gradients.items() if key not in squared_norms],
                                   list(squared_norms.values())),
  }
  if debug_metrics:
    stats["non_finite_examples"] = tf.cast(sums.non_finite, tf.float32)
    stats["gradient_snr"] = tf.sqrt(tf.add_n(signal) / tf.maximum(tf.add_n(noise_squared), 1e-30))
    if selection is not None:
      stats["rows_dropped"] = tf.cast(tf.reduce_sum(selection.num_dropped), tf.float32)
      stats["false_positive_rows"] = tf.cast(tf.reduce_sum(selection.num_false_positives),
                                             tf.float32)
  # Keras sums (or takes the first of) per-replica logs: report once.
  return gradients, {name: value * adds_noise for name, value in stats.items()}


def _noised_dense_weights(clipped: dict, std, seed, expected_batch_size: float):
  """``(clipped + N(0, std^2)) / B`` for every dense weight, from one draw for all of them
  (laid end to end in ``clipped``'s order; one draw is one set of ops, where a draw per
  weight repeats them for every weight). Returns ``(noisy gradient by key, the draw)``."""
  shapes = [key.deref().shape for key in clipped]  # the variables': static, as built
  sizes = [shape.num_elements() for shape in shapes]
  draw = mechanisms.standard_normal([sum(sizes)], seed) * std
  noisy = {key: (value + tf.reshape(part, shape)) / expected_batch_size
           for (key, value), part, shape in zip(clipped.items(), tf.split(draw, sizes), shapes)}
  return noisy, draw


def _divided(gradient, divisor: float):
  """A dense or row-sparse gradient divided by ``divisor``."""
  if isinstance(gradient, tf.IndexedSlices):
    return tf.IndexedSlices(gradient.values / divisor, gradient.indices, gradient.dense_shape)
  return gradient / divisor


def _read_before_update(gradient: tf.IndexedSlices):
  """``(gradient, its squared norm)``, the gradient handed on only once the norm is read.

  The optimizer then holds the gradient's only reference: TensorFlow updates a tensor
  with one reader in place (SGD's ``-lr g``), where a pending read of the norm would make
  it write a copy of a table's size.
  """
  squared = 2.0 * tf.nn.l2_loss(gradient.values)  # one pass, no [V, d] square
  with tf.control_dependencies([squared]):
    values = tf.identity(gradient.values)
  return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape), squared


def _norm(gradients, squared_norms=()) -> tf.Tensor:
  """L2 norm of the noisy update over every variable (dense or row-sparse), with the
  squared norms of gradients already read (:func:`_read_before_update`)."""
  squares = [tf.reduce_sum(tf.square(g.values if isinstance(g, tf.IndexedSlices) else g))
             for g in gradients] + list(squared_norms)
  return tf.sqrt(tf.add_n(squares) if squares else tf.constant(0.0))
