"""One DP gradient: clip per example, select rows, add noise (core paper Algorithm 1).

For a batch with per-example losses ``l_i``:

1. one forward pass records every embedding lookup and ``Dense`` call, and one
   backward pass gives ``dL/d(looked-up vectors)`` and ``dL/dz`` of every Dense
   layer: the per-example gradients of all weights, never materialised as such;
2. for DP-AdaFEST, the clipped contribution map (``C1``) is noised
   (``sigma1 C1``) and thresholded at ``tau``; rows that do not pass are
   zeroed in every example's gradient (lines 6-8);
3. each example's gradient is clipped jointly over all weights to ``C2``;
4. Gaussian noise ``sigma2 C2`` (``sigma C2`` for DP-SGD) goes on the dense
   weights and on the selected rows only (DP-AdaFEST) or on every row
   (DP-SGD, the dense reference); the noisy sum is divided by the *expected*
   batch size, as the accounting assumes.

Under a ``tf.distribute`` strategy with several replicas, each replica holds
part of the batch: all replicas gather every replica's activated rows, so the
contribution map and the selection (same seed) are those of the whole batch;
each replica clips its own examples; only the first replica adds noise, so the
optimizer's sum over replicas carries the noise once per step. The step
statistics come from the first replica; its ``gradient_snr`` measures only its
own share of the clipped sum.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import tensorflow as tf

from sparse_dp import mechanisms
from sparse_dp.layers.embedding import Embedding
from sparse_dp.layers.recording import recording
from sparse_dp.training import dense_layers


@dataclasses.dataclass(frozen=True)
class StepNoise:
  """Noise of one step, resolved from the config (calibrated if needed)."""

  gradient_multiplier: float  # sigma (DP-SGD, DP-FEST) or sigma2 (DP-AdaFEST)
  contribution_multiplier: Optional[float]  # sigma1 for DP-AdaFEST; None: dense noise
  l2_norm_clip: float  # C2
  contribution_clip: float  # C1
  threshold: float  # tau
  expected_batch_size: float

  @property
  def sparse(self) -> bool:
    return self.contribution_multiplier is not None


@dataclasses.dataclass
class _Recorded:
  """Per-example gradients of one batch, by layer."""

  losses: tf.Tensor
  rows: dict  # Embedding -> mechanisms.RowGradients
  dense: dict  # Dense -> (inputs [B, T, k], output gradients [B, T, n])

  @property
  def batch_size(self) -> tf.Tensor:
    return tf.shape(self.losses, out_type=tf.int64)[0]


def private_gradients(leaves: list, compute_losses: Callable[[], tf.Tensor],
                      noise: StepNoise, seed: tf.Tensor):
  """Noisy, clipped gradients of every weight of ``leaves``, and step statistics.

  ``compute_losses`` runs the model forward and returns per-example losses
  ``[B]``. Returns ``(gradients by variable ref, losses, statistics)``.
  """
  recorded = _per_example_gradients(leaves, compute_losses)
  tables = [l for l in leaves if isinstance(l, Embedding)]
  selection_seed, noise_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
  selections = (_select_rows(tables, recorded, noise, selection_seed)
                if noise.sparse and tables else {})
  for layer, selection in selections.items():
    recorded.rows[layer] = mechanisms.restrict_to_rows(recorded.rows[layer], selection.rows)
  factors = mechanisms.clip_factors(_squared_norms(recorded), noise.l2_norm_clip)
  gradients, stats = _noisy_sums(leaves, recorded, selections, factors, noise, noise_seed)
  return gradients, recorded.losses, stats


def _per_example_gradients(leaves, compute_losses) -> _Recorded:
  with tf.GradientTape() as tape:
    with recording() as lookups, dense_layers.recording_dense_calls(leaves) as dense_calls:
      losses = compute_losses()
    total = tf.reduce_sum(losses)
  tables = lookups.by_layer()
  dense_by_layer: dict = {}
  for call in dense_calls:
    dense_by_layer.setdefault(call.layer, []).append(call)
  table_grads, dense_grads = tape.gradient(
      total, ([[l.vectors for l in ls] for ls in tables.values()],
              [[c.preactivation for c in cs] for cs in dense_by_layer.values()]))
  batch_size = tf.shape(losses, out_type=tf.int64)[0]
  rows = {
      layer: mechanisms.per_example_row_gradients(
          tf.concat([l.example for l in ls], 0), tf.concat([l.row for l in ls], 0),
          tf.concat(grads, 0), batch_size)
      for (layer, ls), grads in zip(tables.items(), table_grads)
  }
  dense = {layer: (tf.concat([c.inputs for c in calls], 1), tf.concat(grads, 1))
           for (layer, calls), grads in zip(dense_by_layer.items(), dense_grads)}
  return _Recorded(losses, rows, dense)


def _select_rows(tables, recorded: _Recorded, noise: StepNoise, seed) -> dict:
  """Each table's selected rows, from the contribution map of the whole batch."""
  empty = mechanisms.RowGradients(tf.zeros([0], tf.int64), tf.zeros([0], tf.int64),
                                  tf.zeros([0, 1]))
  pairs = [(recorded.rows.get(layer, empty).example, recorded.rows.get(layer, empty).row)
           for layer in tables]
  pairs, batch_size = _gather_across_replicas(pairs, recorded.batch_size)
  activations = [mechanisms.Activations(example, row, batch_size) for example, row in pairs]
  maps = mechanisms.clipped_contribution_maps(activations, noise.contribution_clip)
  seeds = tf.unstack(tf.random.experimental.stateless_split(seed, len(tables)))
  return {layer: mechanisms.select_rows(contribution, layer.vocabulary_size, noise.threshold,
                                        noise.contribution_multiplier * noise.contribution_clip,
                                        table_seed)
          for layer, contribution, table_seed in zip(tables, maps, seeds)}


def _gather_across_replicas(pairs, batch_size):
  """All replicas' ``(example, row)`` pairs, examples numbered across replicas."""
  context = tf.distribute.get_replica_context()
  if context is None or context.num_replicas_in_sync == 1:
    return pairs, batch_size
  sizes = context.all_gather(batch_size[None], axis=0)
  offset = tf.reduce_sum(sizes[:context.replica_id_in_sync_group])
  gathered = []
  for example, row in pairs:
    local = tf.stack([example + offset, row], axis=1)
    length = tf.shape(local, out_type=tf.int64)[0]
    longest = tf.reduce_max(context.all_gather(length[None], axis=0))
    padded = tf.pad(local, [[0, longest - length], [0, 0]], constant_values=-1)
    everyone = context.all_gather(padded, axis=0)
    everyone = tf.boolean_mask(everyone, everyone[:, 0] >= 0)
    gathered.append((everyone[:, 0], everyone[:, 1]))
  return gathered, tf.reduce_sum(sizes)


def _squared_norms(recorded: _Recorded) -> tf.Tensor:
  """``||g_i||^2`` over every weight, per example."""
  batch_size = recorded.batch_size
  squared = [tf.zeros([batch_size])]
  squared += [mechanisms.squared_norms(g, batch_size) for g in recorded.rows.values()]
  squared += [dense_layers.squared_norms(x, d, layer.use_bias)
              for layer, (x, d) in recorded.dense.items()]
  return tf.add_n(squared)


def _noisy_sums(leaves, recorded: _Recorded, selections, factors, noise: StepNoise, seed):
  """Clipped sums plus noise, divided by the expected batch size, per variable."""
  context = tf.distribute.get_replica_context()
  adds_noise = 1.0 if context is None else tf.cast(
      tf.equal(context.replica_id_in_sync_group, 0), tf.float32)
  std = noise.gradient_multiplier * noise.l2_norm_clip
  seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 2 * len(leaves)))
  gradients, signal, noise_squared = {}, [], []
  nonzero_rows = tf.constant(0, tf.int64)

  def finish(variable, clipped, noisy):
    signal.append(tf.reduce_sum(tf.square(clipped)))
    noise_squared.append(tf.reduce_sum(tf.square(noisy - clipped)))
    gradients[variable.ref()] = noisy

  for i, layer in enumerate(leaves):
    if isinstance(layer, Embedding):
      shape = tf.constant([layer.vocabulary_size, layer.output_dim], tf.int64)
      row_grads = recorded.rows.get(layer, mechanisms.RowGradients(
          tf.zeros([0], tf.int64), tf.zeros([0], tf.int64), tf.zeros([0, layer.output_dim])))
      clipped = mechanisms.clipped_row_sum(row_grads, factors, shape)
      if noise.sparse:
        rows = selections[layer].rows
        kept = mechanisms.sum_on_rows(clipped, rows)
        noisy = kept + tf.random.stateless_normal(tf.shape(kept), seeds[2 * i],
                                                  stddev=std) * adds_noise
        finish(layer.embeddings, kept, noisy)
        gradients[layer.embeddings.ref()] = tf.IndexedSlices(
            noisy / noise.expected_batch_size, rows, shape)
        nonzero_rows += tf.size(rows, out_type=tf.int64)
      else:  # DP-SGD: noise on every row; the clipped rows are scattered into it
        table_noise = tf.random.stateless_normal(shape, seeds[2 * i], stddev=std) * adds_noise
        signal.append(tf.reduce_sum(tf.square(clipped.values)))
        noise_squared.append(tf.reduce_sum(tf.square(table_noise)))
        noisy = tf.tensor_scatter_nd_add(table_noise, clipped.indices[:, None], clipped.values)
        gradients[layer.embeddings.ref()] = noisy / noise.expected_batch_size
        nonzero_rows += layer.vocabulary_size
      continue
    if layer in recorded.dense:
      kernel, bias = dense_layers.clipped_sums(*recorded.dense[layer], factors, layer.use_bias)
    else:  # not called this step: its clipped sum is zero, its noise is not
      kernel = tf.zeros_like(layer.kernel)
      bias = tf.zeros_like(layer.bias) if layer.use_bias else None
    for variable, value, s in ((layer.kernel, kernel, seeds[2 * i]),
                               (layer.bias, bias, seeds[2 * i + 1])):
      if value is not None:
        draw = tf.random.stateless_normal(tf.shape(value), s, stddev=std)
        finish(variable, value, value + draw * adds_noise)
        gradients[variable.ref()] /= noise.expected_batch_size

  table_rows = sum(l.vocabulary_size for l in leaves if isinstance(l, Embedding))
  stats = {
      "nonzero_rows": tf.cast(nonzero_rows, tf.float32),
      "gradient_size_reduction": table_rows / tf.maximum(tf.cast(nonzero_rows, tf.float32), 1.0),
      "gradient_snr": tf.sqrt(tf.add_n(signal) / tf.maximum(tf.add_n(noise_squared), 1e-30)),
  }
  if selections:
    stats["rows_dropped"] = tf.cast(tf.add_n([s.num_dropped for s in selections.values()]),
                                    tf.float32)
    stats["false_positive_rows"] = tf.cast(
        tf.add_n([s.num_false_positives for s in selections.values()]), tf.float32)
  # Keras sums (or takes the first of) per-replica logs: report once.
  return gradients, {name: value * adds_noise for name, value in stats.items()}
