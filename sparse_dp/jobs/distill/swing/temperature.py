"""Swing distillation (Li et al., arXiv 2022): dynamic temperature and soft target protection.

Li et al. ("Swing Distillation: A Privacy-Preserving Knowledge Distillation Framework",
arXiv:2212.08349, 2022) change two things in Hinton's KD, here on next-item prediction:

* dynamic temperature (Eqs. 5-6, Eq. 5 rebuilt from the paper's prose):
  ``tau_t = T + beta / d_t``, ``d_t >= 1`` the distance to the closest clue item
  (``tau_t = T`` without one; clue items: :mod:`~sparse_dp.jobs.distill.swing.swing_data`),
  and ``q_{t,i} = softmax(z_t / tau_t)_i``;
* soft target protection (Eq. 8): ``Lap(0, b)`` on the top-K targets only (K = 3), the scale
  ``b`` taken as it is (see :data:`NO_EPSILON_REASON`), then clipped at 0 and renormalised;
* the loss (Eqs. 10-11): ``L = alpha L_SD + (1 - alpha) CE(y, softmax(z_s))``, ``L_SD`` the
  cross-entropy of the protected targets and ``softmax(z_s / T)``, no ``T**2`` factor.

Plain KD: ``beta = 0`` and ``b = 0``. See docs/commands/distill.md ("Swing's formulas").
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import tensorflow as tf

NO_EPSILON_REASON = (
    "Swing distillation gives no differential privacy guarantee for the teacher's training "
    "data: the seed (003) calls its Laplace parameter a privacy budget (Sec. 3.3, 4.6) but "
    "proves no bound, and none holds: Eq. 8 releases the soft targets of all but the top-K "
    "items without noise, and the top-K set itself is chosen from the un-noised teacher "
    "output, so one teacher training example can change a released value with no noise at "
    "all (no finite epsilon). The Laplace scale is a noise level, not a budget; leakage is "
    "measured empirically by canary exposure instead (Li et al., arXiv 2022, Sec. 4.3).")


def clue_distance(histories: tf.Tensor, clue_items: tf.Tensor) -> tf.Tensor:
  """Distance ``d = L - j`` from the next item to the last clue item ``x_j``; ``inf`` if none.

  ``histories`` int ``[B, L]``, oldest item first; returns float32 ``[B]``.
  """
  histories = tf.convert_to_tensor(histories, tf.int64)
  clue_items = tf.reshape(tf.convert_to_tensor(clue_items, tf.int64), [-1])
  is_clue = tf.reduce_any(histories[:, :, None] == clue_items[None, None, :], axis=2)
  length = tf.shape(histories)[1]
  distance_to_end = tf.cast(length - tf.range(length), tf.float32)  # L - j
  distances = tf.where(is_clue, distance_to_end[None, :], np.inf)
  return tf.reduce_min(distances, axis=1)


@dataclasses.dataclass(frozen=True)
class SwingTargets:
  """The teacher's protected soft targets (Li et al., arXiv 2022, Eqs. 5, 6 and 8).

  ``temperature`` T, ``protection`` beta (0: constant temperature), ``top_k`` K,
  ``noise_scale`` b (0: no noise), ``clue_items`` the clue dictionary C.
  """

  temperature: float
  protection: float
  top_k: int
  noise_scale: float
  clue_items: tuple[int, ...] = ()

  def __post_init__(self):
    if not self.temperature > 0:
      raise ValueError(f"the temperature T must be > 0, got {self.temperature}")
    if self.protection < 0:
      raise ValueError(f"the privacy protection coefficient must be >= 0, got {self.protection}")
    if self.top_k < 1:
      raise ValueError(f"top-K must be >= 1, got {self.top_k}")
    if self.noise_scale < 0:
      raise ValueError(f"the Laplace noise scale must be >= 0, got {self.noise_scale}")

  @classmethod
  def plain_kd(cls, temperature: float) -> "SwingTargets":
    """Hinton's KD: constant temperature, no noise."""
    return cls(temperature, protection=0.0, top_k=1, noise_scale=0.0)

  def temperatures(self, histories: tf.Tensor) -> tf.Tensor:
    """Eq. 5 (rebuilt): ``tau = T + beta / d``, float32 ``[B]``."""
    if not self.clue_items or self.protection == 0:
      return tf.fill([tf.shape(histories)[0]], tf.constant(self.temperature, tf.float32))
    return self.temperature + self.protection / clue_distance(histories, self.clue_items)

  def protect(self, soft_targets: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Eq. 8: ``Lap(0, b)`` added to each row's top-K targets, the rest unchanged.

    Returned as drawn (not clipped or renormalised); ``seed`` is a stateless
    seed, shape ``[2]``.
    """
    if self.noise_scale == 0:
      return soft_targets
    _, top = tf.math.top_k(soft_targets, k=self.top_k)
    noise = laplace_noise(tf.shape(top), self.noise_scale, seed)
    rows = tf.broadcast_to(tf.range(tf.shape(top)[0])[:, None], tf.shape(top))
    indices = tf.stack([rows, top], axis=-1)
    return tf.tensor_scatter_nd_add(soft_targets, indices, tf.cast(noise, soft_targets.dtype))

  def __call__(self, teacher_logits: tf.Tensor, histories: tf.Tensor,
               seed: tf.Tensor) -> tf.Tensor:
    """The targets the student learns from: Eq. 6, Eq. 8, then clipped and renormalised."""
    temperatures = self.temperatures(histories)
    soft_targets = tf.nn.softmax(teacher_logits / temperatures[:, None], axis=-1)
    return as_distribution(self.protect(soft_targets, seed))


def laplace_noise(shape, scale: float, seed: tf.Tensor) -> tf.Tensor:
  """``Lap(0, scale)`` as a random sign times ``Exp(scale) = -scale log(1 - v)``, ``v ~ U[0, 1)``.

  ``v < 1`` always, so every draw is finite. float64.
  """
  draws = tf.random.stateless_uniform(tf.concat([[2], shape], axis=0), seed, dtype=tf.float64)
  magnitude = -scale * tf.math.log1p(-draws[0])
  return tf.where(draws[1] < 0.5, -magnitude, magnitude)


def as_distribution(targets: tf.Tensor) -> tf.Tensor:
  """Clips at 0 and renormalises each row (post-processing of Eq. 8's noisy targets)."""
  clipped = tf.maximum(targets, 0.0)
  total = tf.reduce_sum(clipped, axis=-1, keepdims=True)
  uniform = tf.ones_like(clipped) / tf.cast(tf.shape(clipped)[-1], clipped.dtype)
  return tf.where(total > 0, clipped / tf.maximum(total, 1e-30), uniform)


def distillation_loss(student_logits: tf.Tensor, labels: tf.Tensor,
                      targets: Optional[tf.Tensor], temperature: float,
                      alpha: float) -> tf.Tensor:
  """Eq. 11: ``alpha * L_SD + (1 - alpha) * CE(y, softmax(z_s))``, batch mean.

  ``L_SD`` (Eq. 10) is the cross-entropy of the protected targets against the
  student's softmax at the constant temperature ``T``. ``targets=None`` (or
  ``alpha = 0``) trains on the labels alone (the teacher, or a student alone).
  """
  hard = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=student_logits)
  if targets is None or alpha == 0:
    return tf.reduce_mean(hard)
  soft = tf.nn.softmax_cross_entropy_with_logits(labels=targets,
                                                 logits=student_logits / temperature)
  return tf.reduce_mean(alpha * soft + (1.0 - alpha) * hard)
