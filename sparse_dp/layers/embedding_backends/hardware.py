"""Which embedding backend a strategy's hardware runs: the dispatch of ``--embedding``.

A ``TPUStrategy`` reports its embedding hardware as
``strategy.extended.tpu_hardware_feature.embedding_feature`` (the attribute TFRS dispatches
on; an unknown value reads as ``UNSUPPORTED``):

* ``V1`` (v2, v3, v4): the ``TPUEmbedding`` engine, trained through the two-program loop
  :class:`sparse_dp.training.tpu_loop.TPUTrainer` (backend ``tpu``);
* ``V2`` (SparseCore: v5p, v6e): ``TPUEmbeddingV2`` (TF 2.16+) through
  :class:`~.sparsecore.SparseCoreBackend` in ``fit`` (backend ``sparsecore``); on TF 2.15
  ``tpu`` is refused and ``auto`` takes ``cpu``;
* ``UNSUPPORTED`` (v5e): the ``cpu`` backend, whose DP step XLA compiles.

Off TPU ``auto`` is ``cpu`` and ``engine-double`` runs the engine's update in pure TensorFlow
(:class:`~.doubles.engine_double.EngineDouble`), a testing mode. See docs/tpu.md.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

EmbeddingFeature = tf.tpu.experimental.HardwareFeature.EmbeddingFeature
"""The embedding hardware a TPU reports: ``V1``, ``V2`` (SparseCore) or ``UNSUPPORTED``.

TensorFlow's ``tf.tpu.experimental.HardwareFeature.EmbeddingFeature``.
"""
_API = tf.tpu.experimental.embedding

BACKEND_NAMES = ("auto", "tpu", "cpu", "engine-double")
"""The values of ``--embedding``.

``auto`` is the engine when the hardware has one, else ``cpu``.
``tpu`` is the engine.
``cpu`` is Keras variables.
``engine-double`` is the engine's pure-TF double.
"""

#: The refusal of Keras ``fit`` (one TPU program per step, one embedding round per program:
#: :mod:`.live_engine`) for tables in the engine.
TRAINER_ONLY = ("the TPU embedding engine's tables (embedding 'tpu') run DP steps only in "
                "sparse_dp.training.tpu_loop.TPUTrainer: model.fit runs a step as one TPU "
                "program, which holds one embedding round; train with "
                "TPUTrainer(private).fit(dataset), or make_private with embedding='cpu' for fit")

_NO_ENGINE = {
    None: "no TPU strategy",
    EmbeddingFeature.UNSUPPORTED: "TPU without an embedding engine (v5e)",
    EmbeddingFeature.V2: "TPU with the SparseCore (V2) engine (v5p, v6e), whose API "
                         f"TPUEmbeddingV2 is in TF 2.16+ (this is TF {tf.__version__})",
}


@dataclasses.dataclass(frozen=True)
class BackendChoice:
  """The backend ``--embedding`` resolved to, and why.

  Attributes:
    name: ``"tpu"`` (the V1 engine, trained by ``TPUTrainer``), ``"sparsecore"`` (the V2
      engine, trained by ``fit``), ``"cpu"`` or ``"engine-double"``.
    reason: why this backend, in words.
  """

  name: str
  reason: str

  def describe(self, requested: str) -> str:
    """The choice in one line, e.g. ``"embedding auto -> cpu: no TPU strategy"``.

    Args:
      requested: the ``--embedding`` value asked for.

    Returns:
      ``"embedding <requested> -> <name>: <reason>"``.
    """
    return f"embedding {requested} -> {self.name}: {self.reason}"


def on_tpu(strategy: tf.distribute.Strategy) -> bool:
  """Whether ``strategy`` runs on TPU cores.

  Args:
    strategy: a ``tf.distribute`` strategy.

  Returns:
    True for a ``TPUStrategy``.
  """
  return isinstance(strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy))


def embedding_feature(strategy: tf.distribute.Strategy) -> Optional[EmbeddingFeature]:
  """The embedding hardware of ``strategy``'s TPU.

  Args:
    strategy: a ``tf.distribute`` strategy.

  Returns:
    ``strategy.extended.tpu_hardware_feature.embedding_feature``, or ``None`` off TPU.
  """
  hardware = getattr(strategy.extended, "tpu_hardware_feature", None)
  return None if hardware is None else hardware.embedding_feature


def sparse_cores_per_chip(strategy: tf.distribute.Strategy) -> int:
  """SparseCores per TPU chip of ``strategy`` (``num_embedding_devices_per_chip``).

  4 where the hardware reports none (or off TPU), the value
  ``TPUEmbeddingV2.__init__`` assumes then.
  """
  hardware = getattr(strategy.extended, "tpu_hardware_feature", None)
  return getattr(hardware, "num_embedding_devices_per_chip", 0) or 4


def _engine(feature: Optional[EmbeddingFeature]) -> Optional[BackendChoice]:
  """The embedding engine of ``feature``'s hardware whose API this TF has, or ``None``."""
  if feature == EmbeddingFeature.V1:
    return BackendChoice("tpu", "TPU with the V1 embedding engine (v2, v3, v4): "
                                "trained by sparse_dp.training.tpu_loop.TPUTrainer")
  if feature == EmbeddingFeature.V2 and hasattr(_API, "TPUEmbeddingV2"):  # TF 2.16+
    return BackendChoice("sparsecore", "TPU with the SparseCore (V2) embedding engine (v5p, "
                                       "v6e): TPUEmbeddingV2, updated inside the step "
                                       "model.fit runs")
  return None


def choose_backend(requested: str, strategy: tf.distribute.Strategy,
                   noises_every_row: bool = False) -> BackendChoice:
  """Resolves ``--embedding requested`` under ``strategy``; refuses a backend it cannot run.

  ``tpu`` needs an engine: V1, or V2 where TF has ``TPUEmbeddingV2`` (TF 2.16+).
  ``auto`` takes the engine where the hardware has one, else ``cpu``; for an algorithm that
  noises every row each step (DP-SGD) it takes ``cpu``: an engine would move all ``V`` ids and
  ``V x d`` gradients per replica and step.
  ``engine-double`` runs off TPU only, on one replica.

  Args:
    requested: one of :data:`BACKEND_NAMES`.
    strategy: the strategy the model trains under.
    noises_every_row: whether the algorithm noises every row each step.

  Returns:
    The backend's name and the reason for it.

  Raises:
    ValueError: an unknown ``requested``; ``engine-double`` on a TPU or on several replicas;
      or ``tpu`` without an engine. Off TPU the refusal of ``tpu`` names ``engine-double``
      (tests) and ``cpu``; on a TPU it names ``cpu`` (ordinary TPU variables).
  """
  if requested not in BACKEND_NAMES:
    raise ValueError(f"embedding backend must be one of {', '.join(BACKEND_NAMES)}, "
                     f"got {requested!r}")
  feature, replicas = embedding_feature(strategy), strategy.num_replicas_in_sync
  if requested == "cpu":
    return BackendChoice("cpu", "requested")
  if requested == "engine-double":
    if feature is not None:
      raise ValueError("embedding 'engine-double' runs the TPU embedding engine's update in "
                       "pure TensorFlow off TPU, for tests; on a TPU use 'tpu' or 'cpu'")
    if replicas > 1:
      raise ValueError("embedding 'engine-double' runs on one device; this strategy has "
                       f"{replicas} replicas: use 'cpu'")
    return BackendChoice("engine-double", "requested (the TPU engine's update in pure "
                                          "TensorFlow, for tests)")
  engine = _engine(feature)
  if engine is not None:
    if requested == "auto" and noises_every_row:
      return BackendChoice("cpu", "the algorithm noises every row each step, so an embedding "
                                  "engine would move all V ids and V x d gradients per "
                                  "replica and step: ordinary TPU variables, the step "
                                  "compiled by XLA")
    return engine
  reason = _NO_ENGINE[feature]
  if requested == "auto":
    return BackendChoice("cpu", reason + ("" if feature is None else
                                          ": ordinary TPU variables, the step compiled by XLA"))
  alternative = ("'cpu' (or 'engine-double' to test the engine's update off TPU)"
                 if feature is None else "'cpu' (ordinary TPU variables)")
  raise ValueError(f"embedding 'tpu' (the TPU embedding engine) runs on TPUs with the V1 "
                   f"engine (v2, v3, v4) or, on TF 2.16+, the SparseCore (V2) engine (v5p, "
                   f"v6e) (--strategy tpu); {reason}: use {alternative}")
