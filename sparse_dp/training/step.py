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


def private_gradients(leaves: list, compute_losses: Callable[[], tf.Tensor],
                      noise: StepNoise, seed: tf.Tensor):
  """Noisy, clipped gradients of every weight of ``leaves``, and step statistics.

  ``compute_losses`` runs the model forward and returns per-example losses
  ``[B]``. Returns ``(gradients by variable ref, losses, statistics)``.
  """
  with tf.GradientTape() as tape:
    with recording() as lookups, dense_layers.recording_dense_calls(leaves) as dense_calls:
      losses = compute_losses()
    total = tf.reduce_sum(losses)
  tables = lookups.by_layer()
  dense_by_layer: dict = {}
  for call in dense_calls:
    dense_by_layer.setdefault(call.layer, []).append(call)
  targets = ([[l.vectors for l in ls] for ls in tables.values()],
             [[c.preactivation for c in cs] for cs in dense_by_layer.values()])
  table_grads, dense_grads = tape.gradient(total, targets)
  batch_size = tf.shape(losses, out_type=tf.int64)[0]
  seeds = tf.unstack(tf.random.experimental.stateless_split(seed, 2 * len(leaves) + 2))

  # Per-example row gradients of each table, masked to the selected rows.
  row_grads, selections = {}, {}
  activations = {}
  for layer, layer_lookups in tables.items():
    example = tf.concat([l.example for l in layer_lookups], 0)
    row = tf.concat([l.row for l in layer_lookups], 0)
    grads = tf.concat(table_grads[list(tables).index(layer)], 0)
    row_grads[layer] = mechanisms.per_example_row_gradients(example, row, grads, batch_size)
    activations[layer] = mechanisms.Activations(row_grads[layer].example, row_grads[layer].row,
                                                batch_size)
  if noise.sparse and tables:
    maps = mechanisms.clipped_contribution_maps(list(activations.values()),
                                                noise.contribution_clip)
    for i, (layer, contribution) in enumerate(zip(tables, maps)):
      selections[layer] = mechanisms.select_rows(
          contribution, layer.vocabulary_size, noise.threshold,
          noise.contribution_multiplier * noise.contribution_clip, seeds[i])
      row_grads[layer] = mechanisms.restrict_to_rows(row_grads[layer], selections[layer].rows)

  # Joint per-example norms and clip factors.
  dense_inputs = {layer: (tf.concat([c.inputs for c in calls], 1),
                          tf.concat(dense_grads[i], 1))
                  for i, (layer, calls) in enumerate(dense_by_layer.items())}
  squared = [tf.zeros([batch_size])]
  squared += [mechanisms.squared_norms(g, batch_size) for g in row_grads.values()]
  squared += [dense_layers.squared_norms(x, d, layer.use_bias)
              for layer, (x, d) in dense_inputs.items()]
  factors = mechanisms.clip_factors(tf.add_n(squared), noise.l2_norm_clip)

  # Clipped sums plus noise, per variable.
  std = noise.gradient_multiplier * noise.l2_norm_clip
  gradients, signal, noise_sq = {}, [], []
  nonzero_rows = tf.constant(0, tf.int64)
  for i, layer in enumerate(leaves):
    layer_seed = seeds[len(leaves) + 2 + i] if len(seeds) > len(leaves) + 2 + i else seeds[-1]
    if isinstance(layer, Embedding):
      shape = tf.constant([layer.vocabulary_size, layer.output_dim], tf.int64)
      clipped = (mechanisms.clipped_row_sum(row_grads[layer], factors, shape) if layer in row_grads
                 else tf.IndexedSlices(tf.zeros([0, layer.output_dim]), tf.zeros([0], tf.int64), shape))
      if noise.sparse:
        rows = (selections[layer].rows if layer in selections
                else mechanisms.select_rows(mechanisms.ContributionMap(
                    tf.zeros([0], tf.int64), tf.zeros([0])), layer.vocabulary_size,
                    noise.threshold, noise.contribution_multiplier * noise.contribution_clip,
                    layer_seed).rows)
        noisy = mechanisms.add_row_sparse_noise(clipped, rows, std, layer_seed)
        signal.append(tf.reduce_sum(tf.square(clipped.values)))
        noise_sq.append(tf.reduce_sum(tf.square(noisy.values - _dense_rows(clipped, rows))))
        nonzero_rows += tf.size(rows, out_type=tf.int64)
        gradients[layer.embeddings.ref()] = _scaled(noisy, noise.expected_batch_size)
      else:
        dense_sum = tf.convert_to_tensor(clipped)
        table_noise = tf.random.stateless_normal(tf.shape(dense_sum), layer_seed, stddev=std)
        signal.append(tf.reduce_sum(tf.square(dense_sum)))
        noise_sq.append(tf.reduce_sum(tf.square(table_noise)))
        nonzero_rows += layer.vocabulary_size
        gradients[layer.embeddings.ref()] = (dense_sum + table_noise) / noise.expected_batch_size
    else:
      if layer in dense_inputs:
        kernel, bias = dense_layers.clipped_sums(*dense_inputs[layer], factors, layer.use_bias)
      else:  # not called this step: its clipped sum is zero, the noise is not
        kernel = tf.zeros_like(layer.kernel)
        bias = tf.zeros_like(layer.bias) if layer.use_bias else None
      kernel_seed, bias_seed = tf.unstack(tf.random.experimental.stateless_split(layer_seed, 2))
      for variable, value, s in ((layer.kernel, kernel, kernel_seed), (layer.bias, bias, bias_seed)):
        if value is None:
          continue
        n = tf.random.stateless_normal(tf.shape(value), s, stddev=std)
        signal.append(tf.reduce_sum(tf.square(value)))
        noise_sq.append(tf.reduce_sum(tf.square(n)))
        gradients[variable.ref()] = (value + n) / noise.expected_batch_size

  table_rows = sum(l.vocabulary_size for l in leaves if isinstance(l, Embedding))
  stats = {
      "nonzero_rows": tf.cast(nonzero_rows, tf.float32),
      "gradient_size_reduction": table_rows / tf.maximum(tf.cast(nonzero_rows, tf.float32), 1.0),
      "gradient_snr": tf.sqrt(tf.add_n(signal) / tf.maximum(tf.add_n(noise_sq), 1e-30)),
  }
  if noise.sparse:
    stats["rows_dropped"] = tf.cast(sum(s.num_dropped for s in selections.values()), tf.float32)
    stats["false_positive_rows"] = tf.cast(
        sum(s.num_false_positives for s in selections.values()), tf.float32)
  return gradients, losses, stats


def _dense_rows(clipped: tf.IndexedSlices, rows: tf.Tensor) -> tf.Tensor:
  """The clipped sum on ``rows`` (zeros where it has none), for the SNR statistic."""
  return mechanisms.add_row_sparse_noise(clipped, rows, 0.0, tf.constant([0, 0], tf.int64)).values


def _scaled(slices: tf.IndexedSlices, divisor: float) -> tf.IndexedSlices:
  return tf.IndexedSlices(slices.values / divisor, slices.indices, slices.dense_shape)
