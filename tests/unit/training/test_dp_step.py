"""The DP step's clipped sums equal an explicit per-example computation."""

import dataclasses
import functools
import importlib
import inspect
import itertools
import pkgutil
import re

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats
from tensorflow.python.autograph.utils import ag_logging

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding
from sparse_dp.mechanisms.rows.padding import ordinary_slices
from sparse_dp.training.dp_step import dense_layers
from sparse_dp.training.dp_step.step import StepNoise, private_gradients

from support.stacks import ALPHA

VOCAB_A, VOCAB_B = 50, 30


def build_model():
  keras.utils.set_random_seed(3)
  a = keras.Input(shape=(None,), dtype=tf.int64, ragged=True, name="a")
  b = keras.Input(shape=(), dtype=tf.int64, name="b")
  table_a = Embedding(VOCAB_A, 4, combiner="mean", name="table_a")
  table_b = Embedding(VOCAB_B, 3, name="table_b")
  features = keras.layers.Concatenate()([table_a(a), table_b(b), table_a(b)])  # a shared table
  hidden = keras.layers.Dense(5, activation="tanh")(features)
  logit = keras.layers.Dense(1)(hidden)
  return keras.Model({"a": a, "b": b}, logit)


def batch():
  rng = np.random.default_rng(5)
  a = tf.ragged.constant([rng.integers(0, VOCAB_A, rng.integers(1, 5)).tolist() for _ in range(12)],
                         tf.int64)
  b = tf.constant(rng.integers(0, VOCAB_B, 12), tf.int64)
  y = tf.constant(rng.integers(0, 2, 12), tf.float32)
  return {"a": a, "b": b}, y


def per_example_losses(model, x, y):
  logits = tf.squeeze(model(x, training=True), -1)
  return tf.nn.sigmoid_cross_entropy_with_logits(y, logits) * 50.0  # large: clipping bites


def reference_clipped_sum(model, x, y, clip, keep_rows=None):
  """Loop over examples: full gradient of each, masked, clipped jointly, summed."""
  total = [np.zeros(v.shape) for v in model.trainable_variables]
  for i in range(12):
    xi = {"a": x["a"][i:i + 1], "b": x["b"][i:i + 1]}
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(per_example_losses(model, xi, y[i:i + 1]))
    grads = [tf.convert_to_tensor(g).numpy()
             for g in tape.gradient(loss, model.trainable_variables)]
    if keep_rows is not None:
      for j, v in enumerate(model.trainable_variables):
        if v.name in keep_rows:
          mask = np.zeros(v.shape[0], bool)
          mask[keep_rows[v.name]] = True
          grads[j][~mask] = 0.0
    norm = np.sqrt(sum(np.sum(g ** 2) for g in grads))
    factor = min(1.0, clip / norm)
    total = [t + factor * g for t, g in zip(total, grads)]
  return total


@functools.lru_cache(maxsize=None)
def _traced_step(noise, microbatch_size, debug_metrics):
  """The step of ``build_model()`` at ``noise`` but its gradient multiplier, which it takes as
  an argument: one trace for the noises that differ only there (a number the step multiplies
  by, as the replica's factor it already multiplies by is a tensor)."""
  model = build_model()
  leaves = dense_layers.trainable_leaf_layers(model)

  def losses_of(data):
    return per_example_losses(model, *data), None, None

  @tf.function
  def step(x, y, gradient_multiplier):
    return private_gradients(leaves, losses_of, (x, y),
                             dataclasses.replace(noise, gradient_multiplier=gradient_multiplier),
                             tf.constant([1, 2], tf.int64), microbatch_size,
                             debug_metrics=debug_metrics)
  return model, step


def run_step(noise, microbatch_size=None, debug_metrics=False):
  model, step = _traced_step(dataclasses.replace(noise, gradient_multiplier=0.0), microbatch_size,
                             debug_metrics)
  x, y = batch()
  grads, losses, stats = step(x, y, tf.constant(noise.gradient_multiplier, tf.float32))
  assert losses.shape == (12,)
  return model, [tf.convert_to_tensor(ordinary_slices(grads[v.ref()])).numpy()
                 for v in model.trainable_variables], stats


@functools.lru_cache(maxsize=None)
def _cached_step(noise, microbatch_size, debug_metrics):
  model, grads, stats = run_step(noise, microbatch_size, debug_metrics)
  return ([w.numpy() for w in model.weights], grads,
          {key: value.numpy() for key, value in stats.items()})


def step_of(noise, microbatch_size=None, debug_metrics=False):
  """``run_step`` of ``build_model()`` on ``batch()``, run once per configuration (traced once
  for the configurations alike but in their gradient multiplier) for all tests: the model (at
  the step's weights), copies of the gradients, the statistics."""
  weights, grads, stats = _cached_step(noise, microbatch_size, debug_metrics)
  model = build_model()
  model.set_weights(weights)
  return model, [g.copy() for g in grads], dict(stats)


def test_dpsgd_clipped_sum_matches_per_example_reference():
  x, y = batch()
  # contribution_clip (C1) is DP-AdaFEST's, unused here: micro-batches' [None] step, shared.
  noise = StepNoise(gradient_multiplier=0.0, contribution_multiplier=None, l2_norm_clip=0.7,
                    contribution_clip=3.0, threshold=1.0, expected_batch_size=1.0)
  model, ours, stats = step_of(noise)
  for got, want in zip(ours, reference_clipped_sum(model, x, y, 0.7)):
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6)
  assert float(stats["nonzero_rows"]) == VOCAB_A + VOCAB_B


def test_adafest_masks_unselected_rows_before_clipping():
  x, y = batch()
  # Negligible map noise and tau = 0.99 C1 / sqrt(max pairs): a row passes iff
  # its clipped contribution is at least tau (here: rows of >= 2 examples).
  noise = StepNoise(gradient_multiplier=0.0, contribution_multiplier=1e-7, l2_norm_clip=0.7,
                    contribution_clip=3.0, threshold=1.5, expected_batch_size=1.0)
  model, ours, stats = step_of(noise, debug_metrics=True)
  from sparse_dp.mechanisms import activations, clipped_contribution_maps
  acts = [activations(tf.concat([x["a"], x["b"][:, None]], axis=1)), activations(x["b"])]
  maps = clipped_contribution_maps(acts, 3.0)
  keep = {name: m.rows.numpy()[m.values.numpy() >= 1.5]
          for name, m in zip(["table_a/embeddings:0", "table_b/embeddings:0"], maps)}
  assert 0 < len(keep["table_a/embeddings:0"]) < VOCAB_A
  reference = reference_clipped_sum(model, x, y, 0.7, keep_rows=keep)
  for got, want in zip(ours, reference):
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6)
  assert float(stats["false_positive_rows"]) == 0.0
  assert float(stats["nonzero_rows"]) == sum(len(r) for r in keep.values())


def test_unsupported_layer_is_named():
  inputs = keras.Input(shape=(3,))
  model = keras.Model(inputs, keras.layers.BatchNormalization(name="bn")(inputs))
  with pytest.raises(dense_layers.UnsupportedLayerError, match="'bn'.*BatchNormalization"):
    dense_layers.trainable_leaf_layers(model)
  keras_table = keras.Model(inputs, keras.layers.Embedding(10, 2, name="plain")(inputs))
  with pytest.raises(dense_layers.UnsupportedLayerError, match="sparse_dp.layers.Embedding"):
    dense_layers.trainable_leaf_layers(keras_table)


@pytest.mark.parametrize("contribution_multiplier", [None, 0.5])
def test_micro_batches_give_the_sums_of_one_batch(contribution_multiplier):
  noise = StepNoise(gradient_multiplier=0.0, contribution_multiplier=contribution_multiplier,
                    l2_norm_clip=0.7, contribution_clip=3.0, threshold=1.0,
                    expected_batch_size=1.0)
  _, whole, whole_stats = step_of(noise)
  _, parts, parts_stats = step_of(noise, microbatch_size=5)  # 5 + 5 + 2
  for a, b in zip(whole, parts):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
  assert float(whole_stats["nonzero_rows"]) == float(parts_stats["nonzero_rows"])


@pytest.mark.parametrize("contribution_multiplier", [None, 1e-7])
def test_step_noise_has_std_sigma_c2_on_noised_coordinates_only(contribution_multiplier):
  """The training step's own noise: same seed with and without it, the difference."""
  common = dict(contribution_multiplier=contribution_multiplier, l2_norm_clip=0.7,
                contribution_clip=3.0, threshold=0.5, expected_batch_size=4.0)
  _, noisy, stats_noisy = step_of(StepNoise(gradient_multiplier=1.3, **common))
  _, exact, _ = step_of(StepNoise(gradient_multiplier=0.0, **common))
  diffs = [a - b for a, b in zip(noisy, exact)]
  tables, dense = diffs[:2], diffs[2:]
  noised_rows = sum(int(np.any(t != 0, axis=1).sum()) for t in tables)
  assert noised_rows == float(stats_noisy["nonzero_rows"])  # noise on selected rows only
  if contribution_multiplier is None:
    assert noised_rows == VOCAB_A + VOCAB_B
  std = 1.3 * 0.7 / 4.0  # sigma * C2 / expected batch size
  table_values = np.concatenate([t[np.any(t != 0, axis=1)].ravel() for t in tables])
  dense_values = np.concatenate([d.ravel() for d in dense])
  for values in (table_values, dense_values):  # each group on its own: a wrong scale shows
    n = values.size
    assert n >= 60
    scaled = np.sum(values ** 2) / std ** 2  # ~ chi2(n)
    assert stats.chi2.ppf(ALPHA / 2, n) <= scaled <= stats.chi2.isf(ALPHA / 2, n)


@pytest.mark.parametrize("contribution_multiplier", [None, 1e-7])
def test_no_two_weights_draw_the_same_noise(contribution_multiplier):
  """Every draw is prefix-stable, so two weights drawing from one seed would start with the
  same noise: no weight's noise (the tables', and each Dense weight's part of their one draw)
  starts as another's does."""
  common = dict(contribution_multiplier=contribution_multiplier, l2_norm_clip=0.7,
                contribution_clip=3.0, threshold=0.5, expected_batch_size=4.0)
  _, noisy, _ = step_of(StepNoise(gradient_multiplier=1.3, **common))  # the steps of the test
  _, exact, _ = step_of(StepNoise(gradient_multiplier=0.0, **common))  # above, shared
  starts = []
  for a, b in zip(noisy, exact):
    difference = (a - b).ravel()
    starts.append(np.round(difference[difference != 0][:4], 6))
  assert all(len(start) >= 1 for start in starts)  # the last bias has one coordinate
  for i, j in itertools.combinations(range(len(starts)), 2):
    common_length = min(len(starts[i]), len(starts[j]))
    assert not np.array_equal(starts[i][:common_length], starts[j][:common_length]), (i, j)


def _library_functions() -> set:
  """The names of the plain functions of sparse_dp.mechanisms and sparse_dp.training."""
  names = set()
  for package in (sparse_dp.mechanisms, sparse_dp.training):
    for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
      module = importlib.import_module(info.name)
      names |= {name for name, value in vars(module).items() if inspect.isfunction(value)}
  return names


@pytest.mark.parametrize("ragged", [False, True])  # tf.vectorized_map; tf.map_fn
def test_autograph_runs_the_step_as_written_and_converts_the_models_call(ragged, capsys):
  """A ``tf.function`` around ``private_gradients`` converts none of the library's step
  (``sparse_dp.training.dp_step.tracing``; 91 functions, about 16 s of tracing, when it did),
  dense ids or ragged; the model's own ``call`` is still converted, as Keras does under
  ``fit``: a layer's Python condition on a tensor traces. AutoGraph logs "Not allowed" for
  each function it converts."""

  class Sign(keras.layers.Layer):
    def call(self, inputs):
      if tf.reduce_sum(inputs) >= 0.0:  # a tensor as a Python bool: AutoGraph must convert it
        return inputs
      return -inputs

  keras.utils.set_random_seed(3)
  ids = keras.Input(shape=(None,) if ragged else (), dtype=tf.int64, ragged=ragged)
  table = Embedding(VOCAB_A, 3, combiner="mean" if ragged else None)
  model = keras.Model(ids, keras.layers.Dense(1)(Sign()(table(ids))))
  leaves = dense_layers.trainable_leaf_layers(model)
  noise = StepNoise(gradient_multiplier=0.0, contribution_multiplier=None, l2_norm_clip=0.7,
                    contribution_clip=3.0, threshold=1.0, expected_batch_size=1.0)

  def losses_of(data):
    return tf.squeeze(model(data[0], training=True), -1), None, None

  step = tf.function(lambda data: private_gradients(leaves, losses_of, data, noise,
                                                    tf.constant([1, 2], tf.int64)))
  x, y = batch()
  verbosity, to_stdout = ag_logging.get_verbosity(), ag_logging.echo_log_to_stdout
  tf.autograph.set_verbosity(2, alsologtostdout=True)
  try:
    _, losses, _ = step((x["a"] if ragged else x["b"], y))
  finally:
    tf.autograph.set_verbosity(verbosity, alsologtostdout=to_stdout)
  log = capsys.readouterr().out
  assert losses.shape == (12,)
  # Marked ("Permanently allowed"), or found so by an earlier test of the process ("Allowlisted").
  assert re.search(r"(Permanently allowed: |Allowlisted )<function private_gradients", log)
  assert re.search(r"Not allowed: <bound method \S*Sign\.call", log)
  converted = set(re.findall(r"Not allowed: <function ([\w.<>]+) at", log))
  assert not converted & _library_functions(), converted
