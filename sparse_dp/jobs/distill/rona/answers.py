"""The teacher's answer to one batch of public queries, sanitized (RONA Algorithm 2).

Each example's answer (its hint vector, or its logit) is clipped to L2 norm
``C``; Gaussian noise ``N(0, (sigma C)^2)`` is added to every coordinate. RONA
clips the whole batch response to ``B`` and argues its sensitivity is ``B``;
here each example is clipped (the batch then has norm at most ``C sqrt(S)``),
and the accounting (:mod:`sparse_dp.jobs.distill.rona.privacy`) uses the true
sensitivity of a batch answer to one private training example.
"""

from __future__ import annotations

import secrets
from typing import Optional

import numpy as np


def clip_rows(values: np.ndarray, clip: float) -> np.ndarray:
  """Each row of ``values`` ``[S, D]`` scaled to L2 norm at most ``clip``."""
  norms = np.linalg.norm(values, axis=1, keepdims=True)
  scale = np.minimum(1.0, clip / np.maximum(norms, np.finfo(np.float64).tiny))
  return values * scale


class NoisyAnswers:
  """Answers batches of queries with per-example clipping and Gaussian noise; counts them.

  ``noise_multiplier`` is sigma: the noise's standard deviation is ``sigma * C``
  for the clip ``C`` of each answer. The noise comes from a secret seed drawn
  from the operating system unless ``noise_seed`` fixes it (experiments only:
  who knows the seed can subtract the noise).
  """

  def __init__(self, noise_multiplier: float, noise_seed: Optional[int] = None):
    if not noise_multiplier > 0:
      raise ValueError(f"the noise multiplier must be > 0, got {noise_multiplier}")
    self.noise_multiplier = noise_multiplier
    self._rng = np.random.default_rng(secrets.randbits(128) if noise_seed is None
                                      else [noise_seed, 14])
    self.batch_sizes: list[int] = []  # one entry per answered batch
    self.clips: list[float] = []

  def answer(self, values: np.ndarray, clip: float) -> np.ndarray:
    """``values`` ``[S, D]`` (the teacher's un-noised answers) clipped to ``clip`` and noised."""
    if not clip >= 0:
      raise ValueError(f"the clip must be >= 0, got {clip}")
    values = np.asarray(values, np.float64)
    self.batch_sizes.append(len(values))
    self.clips.append(float(clip))
    noise = self._rng.normal(0.0, self.noise_multiplier * clip, values.shape)
    return (clip_rows(values, clip) + noise).astype(np.float32)
