"""The compact pCTR student and what the pCTR methods share: evaluation, soft-target fitting.

The student is :func:`sparse_dp.models.pctr.build_pctr_model` with hashed
tables (feature ``i``'s ids hashed into ``share x`` the teacher's rows, at least
2), narrower embeddings (``int(2 rows^0.25)`` of its own rows by default) and a
smaller ReLU tower; it takes the teacher's inputs, so it serves in its place.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.jobs.train.job_flags import layer_widths
from sparse_dp.models.pctr import build_pctr_model, save_model


@dataclasses.dataclass(frozen=True)
class StudentShape:
  """Rows of each hashed table, one embedding width (None: per table) and the ReLU widths."""

  rows: tuple[int, ...]
  hidden_units: tuple[int, ...]
  embedding_dim: Optional[int] = None

  @classmethod
  def from_args(cls, args, teacher_sizes: Sequence[int]) -> "StudentShape":
    if not 0 < args.student_rows <= 1:
      raise ValueError(f"--student-rows must be a share in (0, 1], got {args.student_rows}")
    hidden = layer_widths(args.student_hidden_units, "--student-hidden-units")
    if args.student_embedding_dim is not None and args.student_embedding_dim < 1:
      raise ValueError(f"--student-embedding-dim must be >= 1, got {args.student_embedding_dim}")
    rows = tuple(max(2, int(round(size * args.student_rows))) for size in teacher_sizes)
    return cls(rows, hidden, args.student_embedding_dim)

  def build(self, teacher_sizes: Sequence[int]) -> keras.Model:
    """The student over the teacher's ids (``teacher_sizes`` rows per feature)."""
    dims = None if self.embedding_dim is None else [self.embedding_dim] * len(self.rows)
    return build_pctr_model(teacher_sizes, self.hidden_units, dims, hashed_rows=self.rows)

  def to_dict(self) -> dict:
    return {"table_rows": sum(self.rows), "hidden_units": list(self.hidden_units),
            "embedding_dim": self.embedding_dim or "int(2 rows^0.25) per table"}


def logits(model: keras.Model, features: dict, batch_size: int = 8192) -> np.ndarray:
  """``model``'s logits ``[N, 1]`` on ``features``."""
  return model.predict(features, batch_size=batch_size, verbose=0)


def quality(model: keras.Model, held_out: tuple) -> dict:
  """Held-out AUC and log-loss of ``model`` (a logit output)."""
  features, labels = held_out
  z = logits(model, features)
  auc = keras.metrics.AUC(from_logits=True)
  auc.update_state(labels, z)
  return {"auc": float(auc.result()), "logloss": float(
      tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, z)))}


def quality_fields(teacher: keras.Model, student: keras.Model, held_out: tuple) -> dict:
  """Teacher and student held-out AUC and log-loss, and the AUC the student loses."""
  teacher_quality, student_quality = quality(teacher, held_out), quality(student, held_out)
  return {"teacher_auc": teacher_quality["auc"], "student_auc": student_quality["auc"],
          "auc_loss": teacher_quality["auc"] - student_quality["auc"],
          "teacher_logloss": teacher_quality["logloss"],
          "student_logloss": student_quality["logloss"],
          "eval_examples": int(len(held_out[1]))}


def soft_target_loss(temperature: float = 1.0):
  """Cross-entropy ``H(sigmoid(z_t / tau), sigmoid(z_s / tau))`` of target logits ``z_t``.

  Hinton et al.'s distillation loss for one binary output (RONA eq. 4).
  """
  def loss(target_logits, student_logits):
    return keras.losses.binary_crossentropy(tf.sigmoid(target_logits / temperature),
                                            student_logits / temperature, from_logits=True)
  return loss


def fit(model: keras.Model, features: dict, targets: np.ndarray, loss, args, epochs: int,
        batch_size: int, shuffle: bool = True) -> None:
  """Adam (``--student-learning-rate``) on ``(features, targets)``; no validation data."""
  model.compile(optimizer=keras.optimizers.Adam(args.student_learning_rate), loss=loss)
  model.fit(features, targets, batch_size=batch_size, epochs=epochs, shuffle=shuffle,
            verbose=0)


def save(model: keras.Model, vocabulary, folder) -> str:
  """``model`` (a SavedModel) in ``folder/model`` and ``vocabulary.json``, as ``sparse-dp train``
  writes them."""
  folder = pathlib.Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  # Compiled with the pCTR job's loss, so load_model needs no custom object beyond the
  # layers sparse_dp registers when imported.
  model.compile(loss=keras.losses.BinaryCrossentropy(from_logits=True))
  save_model(model, folder / "model", include_optimizer=False)
  vocabulary.save(folder / "vocabulary.json")
  return str(folder)
