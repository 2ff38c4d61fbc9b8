"""Keras layers for DP training with sparse gradients."""

from sparse_dp.layers.embedding import Embedding

__all__ = ["Embedding"]
