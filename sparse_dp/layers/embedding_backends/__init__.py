"""Embedding backends: where tables live and how the DP update reaches them.

:func:`choose_backend` resolves ``--embedding`` by the strategy's hardware
(:mod:`.hardware`): ``tpu`` is the V1 TPU embedding engine, whose tables
:class:`sparse_dp.training.tpu_loop.TPUTrainer` trains through
:class:`TwoProgramBackend` (two TPU programs per step on :class:`LiveEngine`,
tested through :mod:`.doubles.tpu_api_double`, never run on a TPU), and on SparseCore (V2)
hardware ``TPUEmbeddingV2``, updated inside ``fit``'s step by
:class:`SparseCoreBackend` (tested through :mod:`.doubles.sparsecore_api_double`);
``cpu`` is Keras variables (CPU, GPU, ordinary TPU variables);
``engine-double`` runs the engine's update off TPU in :class:`EngineDouble`,
a pure-TensorFlow engine (for tests and comparisons); ``auto`` takes the
engine where the hardware has one, else ``cpu``, and says why. See docs/tpu.md.
"""

from sparse_dp.layers.embedding_backends.base import CpuBackend, EmbeddingBackend
from sparse_dp.layers.embedding_backends.doubles.engine_double import EngineDouble
from sparse_dp.layers.embedding_backends.hardware import (
                                                          BACKEND_NAMES,
                                                          BackendChoice,
                                                          EmbeddingFeature,
                                                          choose_backend,
                                                          embedding_feature,
                                                          on_tpu,
)
from sparse_dp.layers.embedding_backends.live_engine import LiveEngine
from sparse_dp.layers.embedding_backends.sparsecore import SparseCoreBackend
from sparse_dp.layers.embedding_backends.tpu import TPUEmbeddingBackend
from sparse_dp.layers.embedding_backends.two_program import TwoProgramBackend

__all__ = ["BACKEND_NAMES", "BackendChoice", "CpuBackend", "EmbeddingBackend",
           "EmbeddingFeature", "EngineDouble", "LiveEngine", "SparseCoreBackend",
           "TPUEmbeddingBackend", "TwoProgramBackend", "choose_backend", "embedding_feature",
           "on_tpu"]
