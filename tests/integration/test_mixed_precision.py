"""Mixed precision trains privately: 16-bit compute, float32 clipping and
noise, a fixed loss scale divided out before clipping; all under ``jit_compile=True``."""

import contextlib
import functools

import numpy as np
import pytest
import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding
from sparse_dp.mechanisms.rows.padding import ordinary_slices
from sparse_dp.training.checks.validation import ModelValidationError
from sparse_dp.training.dp_step import dense_layers
from sparse_dp.training.dp_step.losses import per_example_loss_fn
from sparse_dp.training.dp_step.step import StepNoise, private_gradients

from support.keras_models import N, synthetic_data
from support.stacks import one_stack
from support.tiers import first_case_fast

VOCAB, B = 50, 12
NOISE = {"dpsgd": dict(noise_multiplier=0.8),
         "adafest": dict(sigma1=3.0, sigma2=0.8, threshold=3.0)}
FIXED_SCALE = 128.0
BCE = keras.losses.BinaryCrossentropy(from_logits=True)


@contextlib.contextmanager
def global_policy(name: str):
  keras.mixed_precision.set_global_policy(name)
  try:
    yield
  finally:
    keras.mixed_precision.set_global_policy("float32")


def optimizer_for(policy: str, dynamic: bool = False):
  optimizer = keras.optimizers.legacy.SGD(0.5)
  if policy != "mixed_float16":
    return optimizer
  return keras.mixed_precision.LossScaleOptimizer(
      optimizer, dynamic=dynamic, initial_scale=None if dynamic else FIXED_SCALE)


def model_under(policy: str, optimizer=None) -> keras.Model:
  """Embedding -> Dense(16, tanh) -> Dense(1), built under ``policy``, compiled for XLA.

  tanh, not ReLU: 16-bit rounding moves a pre-activation near a ReLU kink across it,
  a jump of that unit's gradient, not the rounding this test bounds.
  """
  with global_policy(policy):
    keras.utils.set_random_seed(3)
    ids = keras.Input(shape=(), dtype=tf.int64)
    hidden = keras.layers.Dense(16, activation="tanh")(Embedding(VOCAB, 8, name="ids")(ids))
    model = keras.Model(ids, keras.layers.Dense(1, name="logit")(hidden))
    model.compile(optimizer=optimizer or optimizer_for(policy), loss=BCE, jit_compile=True)
  return model


@functools.lru_cache(maxsize=None)
def trained(policy: str, algorithm: str):
  """Initial and trained weights and the epsilon of 3 compiled DP steps (seed 1)."""
  ids, labels = synthetic_data()
  ids %= VOCAB
  model = model_under(policy)
  initial = [w.numpy() for w in model.trainable_weights]
  with global_policy(policy):
    private = sparse_dp.make_private(
        model, sparse_dp.DPConfig(algorithm, noise_seed=1, **NOISE[algorithm]),
        num_examples=N, batch_size=256)
    model.fit(private.poisson_dataset(ids, labels).take(3), verbose=0)
  assert model._jit_compile and private.accountant.steps == 3
  assert private.loss_scale == (FIXED_SCALE if policy == "mixed_float16" else 1.0)
  assert all(w.dtype == tf.float32 for w in model.trainable_weights)
  compute = {layer.compute_dtype for layer in model.layers if layer.trainable_weights}
  assert compute == {"float32" if policy == "float32" else policy.split("_")[1]}
  return initial, [w.numpy() for w in model.trainable_weights], private.epsilon()


@pytest.mark.slow  # the properties it rests on are the fast tests below
@pytest.mark.parametrize("policy, algorithm", [  # an algorithm's cases on one stack: one
    pytest.param(policy, algorithm, marks=one_stack(stack))  # float32 fit (trained) serves both
    for algorithm, stack in (("dpsgd", "tf2.21"), ("adafest", "tf2.15"))
    for policy in ("mixed_bfloat16", "mixed_float16")])
def test_a_mixed_precision_fit_compiles_and_stays_close_to_the_float32_fit(policy, algorithm):
  # Same seed: the same noise and (DP-AdaFEST) the same selected rows, drawn in
  # float32; only the clipped per-example gradients differ, by 16-bit rounding
  # of the forward and backward pass (relative rounding: bfloat16 2^-8,
  # float16 2^-11). The weights must be within 1% of the float32 steps'
  # movement of the float32 weights;
  # a loss scale left in the gradients (128x) would change every unclipped
  # example's clipped gradient.
  initial, reference, epsilon = trained("float32", algorithm)
  _, weights, mixed_epsilon = trained(policy, algorithm)
  assert mixed_epsilon == epsilon  # the same mechanism, the same accountant events
  moved = np.sqrt(sum(np.sum((w - w0) ** 2) for w, w0 in zip(reference, initial)))
  apart = np.sqrt(sum(np.sum((w - r) ** 2) for w, r in zip(weights, reference)))
  assert moved > 0.1 and apart < 0.01 * moved


@functools.lru_cache(maxsize=None)
def compiled_step(policy: str, sparse: bool = False, microbatch_size=None):
  """A model of :func:`model_under` ``policy`` and its DP step on a batch, compiled by XLA.

  sigma, C2 and the loss scale are tensor arguments, so one compiled program serves every
  value of them (with ``debug_metrics``: the statistics are added, the gradients the same).
  Shared by the tests: nothing they run writes the model's weights (no optimizer step).

  Returns:
    ``(model, step)``: ``step(data, sigma, clip, loss_scale)`` returns ``private_gradients``'s
      gradients, losses and statistics.
  """
  model = model_under(policy)
  leaves = dense_layers.trainable_leaf_layers(model)

  @tf.function(jit_compile=True)
  def step(data, sigma, clip, loss_scale):
    return private_gradients(leaves, per_example_loss_fn(model), data,
                             step_noise(sigma, clip, sparse), tf.constant([3, 4], tf.int64),
                             microbatch_size, debug_metrics=True, loss_scale=loss_scale)

  return model, step


def gradients_of(policy: str, sigma: float, clip: float, sparse: bool = False,
                 loss_scale: float = 1.0, microbatch_size=None):
  """The DP step's gradients (as dense arrays) and statistics on one batch of ``B``, compiled
  by XLA (:func:`compiled_step`, noise :func:`step_noise`)."""
  rng = np.random.default_rng(0)
  data = (tf.constant(rng.integers(0, VOCAB, B), tf.int64),
          tf.constant(rng.integers(0, 2, (B, 1)), tf.float32))
  model, step = compiled_step(policy, sparse, microbatch_size)
  gradients, _, stats = step(data, *(tf.constant(value, tf.float32)
                                     for value in (sigma, clip, loss_scale)))
  assert all(g.dtype == tf.float32 for g in gradients.values())
  return ([tf.convert_to_tensor(ordinary_slices(gradients[v.ref()])).numpy()
           for v in model.trainable_variables], stats)


def step_noise(sigma: float, clip: float, sparse: bool = False) -> StepNoise:
  return StepNoise(gradient_multiplier=sigma, contribution_multiplier=1.0 if sparse else None,
                   l2_norm_clip=clip, contribution_clip=1.0, threshold=0.5,
                   expected_batch_size=1.0)


def test_an_example_is_clipped_in_float32_under_bfloat16():
  # One example's clipped gradient has norm C2 exactly up to float32 rounding;
  # a norm or a clipping in bfloat16 (8 significant bits) would be off by ~1e-3.
  model, clip = model_under("mixed_bfloat16"), 1e-3
  leaves = dense_layers.trainable_leaf_layers(model)
  step = tf.function(lambda data: private_gradients(
      leaves, per_example_loss_fn(model), data, step_noise(0.0, clip),
      tf.constant([3, 4], tf.int64)), jit_compile=True)
  for i in range(3):
    gradients, _, _ = step((tf.constant([7 * i], tf.int64), tf.constant([[float(i % 2)]])))
    norm = np.sqrt(sum(np.sum(tf.convert_to_tensor(ordinary_slices(g)).numpy().astype(float) ** 2)
                       for g in gradients.values()))
    assert norm == pytest.approx(clip, rel=1e-6)


@pytest.mark.parametrize("sparse", first_case_fast([True, False], ids=["adafest", "dpsgd"]))
def test_the_noise_of_a_bfloat16_step_is_the_float32_steps_draw(sparse):
  # Noise sigma C2 = 5e5 drawn in float32 from the seed whatever the layers
  # compute in: the bfloat16 and float32 steps differ by their clipped sums
  # alone, at most 2 B C2 = 12 in norm (plus float32 rounding of values near
  # 5e5, ~0.06 each). Noise drawn or added in bfloat16 (8 significant bits)
  # would be off by ~1e3 in each coordinate.
  (float32, _), (bfloat16, _) = (gradients_of(policy, 1e6, 0.5, sparse)
                                 for policy in ("float32", "mixed_bfloat16"))
  assert min(np.abs(g).max() for g in float32) > 1e5  # it is the noise
  apart = np.sqrt(sum(np.sum((a.astype(float) - b) ** 2) for a, b in zip(bfloat16, float32)))
  assert apart <= 2 * B * 0.5 + 2


@pytest.mark.parametrize("microbatch_size", first_case_fast([None, 5]))
def test_the_loss_scale_is_divided_out_of_each_example_before_clipping(microbatch_size):
  # float16, no noise, C2 at the median example norm: half the examples are
  # clipped, half not. With the scale divided out before clipping the step is
  # the same for S = 1 and S = 1024 (a power of two scales float16 exactly);
  # left in, the unclipped examples would count 1024 times, and divided out
  # after clipping, the clipped ones would count C2 / 1024.
  # One compiled step for both scales (and the overflow test's three steps).
  norms = per_example_norms(compiled_step("mixed_float16")[0])
  clip = float(np.median(norms))
  unscaled, scaled = (gradients_of("mixed_float16", 0.0, clip, loss_scale=scale,
                                   microbatch_size=microbatch_size)[0] for scale in (1.0, 1024.0))
  for a, b in zip(unscaled, scaled):
    np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
  assert (norms > clip).any() and (norms < clip).any()


def per_example_norms(model) -> np.ndarray:
  """Each example's gradient norm (a step with C2 = 1e9 and a batch of one, per example; one
  graph traced once for every example)."""
  rng = np.random.default_rng(0)
  ids, labels = rng.integers(0, VOCAB, B), rng.integers(0, 2, B)
  leaves = dense_layers.trainable_leaf_layers(model)
  step = tf.function(lambda data: private_gradients(
      leaves, per_example_loss_fn(model), data, step_noise(0.0, 1e9),
      tf.constant([3, 4], tf.int64)))
  norms = []
  for i, label in zip(ids, labels):
    gradients, _, _ = step((tf.constant([i]), tf.constant([[float(label)]])))
    norms.append(np.sqrt(sum(np.sum(tf.convert_to_tensor(ordinary_slices(g)).numpy() ** 2)
                             for g in gradients.values())))
  return np.array(norms)


@pytest.mark.parametrize("microbatch_size", [  # 5: the loss scale test's [5] compiled step
    None, pytest.param(5, marks=[pytest.mark.slow, one_stack("tf2.15")])])
def test_a_float16_overflow_zeroes_its_example_as_any_non_finite_example(microbatch_size):
  # S = 2^20: dl/dz ~ 0.5 S overflows float16 (largest 65504) in every example;
  # each is zeroed before clipping and counted; the update is finite (the noise).
  gradients, stats = gradients_of("mixed_float16", 1.0, 1.0, loss_scale=2.0 ** 20,
                                  microbatch_size=microbatch_size)
  assert float(stats["non_finite_examples"]) == B
  noise_only, _ = gradients_of("mixed_float16", 1.0, 1.0)
  clean, _ = gradients_of("mixed_float16", 0.0, 1.0)
  for got, noisy, signal in zip(gradients, noise_only, clean):
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, noisy - signal, rtol=0, atol=1e-5)


def test_a_dynamic_loss_scale_is_refused_naming_a_fixed_one():
  fix = r"LossScaleOptimizer\(optimizer, dynamic=False, initial_scale=S\)"
  explicit = model_under("mixed_float16", optimizer_for("mixed_float16", dynamic=True))
  with pytest.raises(ModelValidationError, match=r"LossScaleOptimizer with dynamic=True.*un-noised"
                                                 r" gradients.*" + fix):
    sparse_dp.make_private(explicit, sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0),
                           num_examples=N, batch_size=256)
  model = model_under("mixed_float16")
  private = sparse_dp.make_private(model, sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0),
                                   num_examples=N, batch_size=256)
  with pytest.raises(ModelValidationError, match=r"'mixed_float16', for which Keras's compile "
                                                 r"wraps the optimizer.*" + fix):
    model.compile(optimizer=keras.optimizers.legacy.SGD(0.5), loss=BCE)  # a plain optimizer
  model.compile(optimizer=keras.mixed_precision.LossScaleOptimizer(
      keras.optimizers.legacy.SGD(0.5), dynamic=False, initial_scale=64.0), loss=BCE)
  assert isinstance(model.optimizer, keras.optimizers.legacy.SGD) and private.loss_scale == 64.0


def test_the_probe_still_finds_a_batch_mean_in_a_bfloat16_model():
  # The probe runs the layers in float32: 16-bit rounding is not refused
  # (tests/unit/training/test_refusal_messages.py), and a real coupling still is.
  with global_policy("mixed_bfloat16"):
    ids = keras.Input(shape=(), dtype=tf.int64)
    centred = keras.layers.Lambda(lambda h: h - tf.reduce_mean(h, axis=0), name="centre")(
        Embedding(VOCAB, 4)(ids))
    model = keras.Model(ids, keras.layers.Dense(1)(centred))
    model.compile(optimizer=keras.optimizers.legacy.SGD(0.1), loss=BCE)
  sparse_dp.make_private(model, sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0),
                         num_examples=N, batch_size=16)
  with pytest.raises(ModelValidationError, match=r"'centre'.*mixes examples"):
    model.fit(np.arange(32) % VOCAB, np.ones(32, "float32"), batch_size=16, verbose=0)
  assert model.layers[1].compute_dtype == "bfloat16"  # restored after the probe
