"""Test doubles of the TPU embedding APIs, and the pure-TensorFlow engine double.

Not production backends: :mod:`.tpu_api_double` and :mod:`.sparsecore_api_double`
stand in for TensorFlow's ``TPUEmbedding`` (V1) and ``TPUEmbeddingV2`` off TPU;
:mod:`.engine_double` (``--embedding engine-double``) runs the engine's update in
TensorFlow for tests and comparisons. See ``docs/tpu.md``.
"""
