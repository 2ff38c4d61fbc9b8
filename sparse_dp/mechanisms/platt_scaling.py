"""Private Platt scaling: ``p = sigmoid(a z + b)`` fitted by noisy gradient descent on a sample.

Platt scaling (Platt, 1999) recalibrates a trained model's logit ``z`` by a logistic
regression on it; with ``a > 0`` (kept ``>= MIN_SLOPE``) it changes no ranking. Each logit is
clipped to ``[-Z, Z]``, so an example's logistic-loss gradient in ``(a, b)``,
``(sigmoid(a z~ + b) - y) (z~, 1)``, has norm at most ``C = sqrt(Z^2 + 1)``, whatever the
model. The fit reads one Poisson sample of rate ``q`` of the examples; each of ``T`` steps
releases the *sum* of the sample's gradients plus ``N(0, (sigma C)^2 I_2)``. The ``T`` steps
are one Gaussian of noise multiplier ``sigma / sqrt(T)`` on that sample, accounted as
``PoissonSampledDpEvent(q, GaussianDpEvent(sigma / sqrt(T)))``
(:func:`sparse_dp.accounting.calibrate_after`). The noisy sum is divided by the *public*
``q N`` and the Adam update (Kingma & Ba, ICLR 2015) after it is post-processing.
See docs/calibration.md ("Private Platt scaling").
"""

from __future__ import annotations

import dataclasses
import math

import tensorflow as tf

from sparse_dp._keras import keras

DEFAULT_LOGIT_CLIP = 8.0  # Z: sigmoid(8) = 0.9997, wider than any calibrated pCTR logit
DEFAULT_STEPS = 200
DEFAULT_LEARNING_RATE = 0.05
MIN_SLOPE = 1e-3
# Step t's noise is keyed (noise_seed, NOISE_STREAM + t), away from the training's keys.
NOISE_STREAM = 2 ** 48


@dataclasses.dataclass(frozen=True)
class PlattMechanism:
  """``steps`` noisy gradient sums of sensitivity ``sqrt(logit_clip^2 + 1)`` on one sample."""

  noise_multiplier: float  # sigma
  steps: int = DEFAULT_STEPS  # T
  logit_clip: float = DEFAULT_LOGIT_CLIP  # Z
  learning_rate: float = DEFAULT_LEARNING_RATE
  sampling_rate: float = 1.0  # q of the one Poisson sample the steps read

  def __post_init__(self):
    if not self.noise_multiplier > 0:
      raise ValueError(f"noise_multiplier must be > 0, got {self.noise_multiplier}")
    if self.steps < 1:
      raise ValueError(f"steps must be >= 1, got {self.steps}")
    if not self.logit_clip > 0:
      raise ValueError(f"logit_clip must be > 0, got {self.logit_clip}")
    if not 0 < self.sampling_rate <= 1:
      raise ValueError(f"sampling_rate must be in (0, 1], got {self.sampling_rate}")

  @property
  def sensitivity(self) -> float:
    """``C = sqrt(Z^2 + 1)``: the largest norm of one example's gradient in ``(a, b)``."""
    return math.sqrt(self.logit_clip ** 2 + 1.0)

  def noisy_gradient_sum(self, logits: tf.Tensor, labels: tf.Tensor, slope: tf.Tensor,
                         intercept: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """One release: :func:`noisy_gradient_sum` with noise ``sigma C`` and clip ``Z``, under XLA."""
    noise_std = tf.constant(self.noise_multiplier * self.sensitivity, logits.dtype)
    return _compiled_gradient_sum(logits, labels, slope, intercept, noise_std,
                                  self.logit_clip, seed)


def noisy_gradient_sum(logits: tf.Tensor, labels: tf.Tensor, slope: tf.Tensor,
                       intercept: tf.Tensor, noise_std: tf.Tensor, logit_clip: float,
                       seed: tf.Tensor) -> tf.Tensor:
  """``sum_i (sigmoid(a z~_i + b) - y_i) (z~_i, 1) + N(0, noise_std^2 I_2)``, shape ``[2]``."""
  clipped = tf.clip_by_value(logits, -logit_clip, logit_clip)
  residual = tf.sigmoid(slope * clipped + intercept) - labels
  total = tf.stack([tf.reduce_sum(residual * clipped), tf.reduce_sum(residual)])
  return total + noise_std * tf.random.stateless_normal([2], seed, dtype=total.dtype)


_compiled_gradient_sum = tf.function(noisy_gradient_sum, jit_compile=True)


@dataclasses.dataclass(frozen=True)
class PlattScaling:
  """The fitted map ``z -> a z + b`` (``a >= MIN_SLOPE``)."""

  slope: float
  intercept: float

  @classmethod
  def fit(cls, logits, labels, mechanism: PlattMechanism, expected_examples: float,
          noise_seed: int) -> "PlattScaling":
    """Fits ``(a, b)`` from ``mechanism.steps`` noisy gradient sums of ``(logits, labels)``.

    Starts at the identity ``(1, 0)``; the noise of step ``t`` is keyed by
    ``(noise_seed, NOISE_STREAM + t)``.

    Args:
      logits: the sample's logits ``z``.
      labels: their labels ``y`` in ``{0, 1}``.
      mechanism: the noise, steps, clip and step size.
      expected_examples: the public ``q N`` each noisy sum is divided by (the sample's
        size would reveal it).
      noise_seed: the secret seed of the noise.

    Returns:
      The fitted map.

    Raises:
      ValueError: ``expected_examples <= 0``.
    """
    if not expected_examples > 0:
      raise ValueError(f"expected_examples must be > 0, got {expected_examples}")
    z = tf.reshape(tf.cast(logits, tf.float64), [-1])
    y = tf.reshape(tf.cast(labels, tf.float64), [-1])
    theta = tf.Variable(tf.constant([1.0, 0.0], tf.float64))
    optimizer = keras.optimizers.Adam(mechanism.learning_rate)
    for t in range(mechanism.steps):
      seed = tf.constant([noise_seed, NOISE_STREAM + t], tf.int64)
      gradient = mechanism.noisy_gradient_sum(z, y, theta[0], theta[1], seed)
      optimizer.apply_gradients([(gradient / expected_examples, theta)])
      theta.assign(tf.stack([tf.maximum(theta[0], MIN_SLOPE), theta[1]]))
    slope, intercept = theta.numpy().tolist()
    return cls(slope, intercept)

  def fold_into(self, output: keras.layers.Dense) -> None:
    """Makes the linear output layer ``z = W h + c`` compute ``a z + b = (a W) h + (a c + b)``."""
    kernel, bias = output.kernel, output.bias
    kernel.assign(self.slope * kernel)
    bias.assign(self.slope * bias + self.intercept)
