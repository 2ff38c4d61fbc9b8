"""How strongly a pCTR training run shows each canary (higher: more likely included).

* ``loss`` (black-box): minus the canary's log-loss under the trained model (Steinke et al.,
  NeurIPS 2023, §6; the Secret Sharer's exposure).
* ``row_movement`` (white-box): ``||E_T[rows_j] - E_0[rows_j]||_2`` over the canary's own
  rows, from the initial to the trained tables.
* ``step_alignment`` (white-box, every step): ``sum_t <-(E_t - E_{t-1})[rows_j],
  g_{j,t} / ||g_{j,t}||>``, the step-``t`` update of canary ``j``'s own rows along the
  direction that lowers its loss at the model the step started from, summed over the steps
  (:class:`StepAlignment`): the white-box audit of DP-SGD of Steinke et al. §6.

The training keeps the job's Adam (the audit tests what ships). A canary's own rows are those
no training example and no other canary looks up after any preselection; a canary with none
scores 0 on the white-box scores. See docs/commands/audit.md ("How the audit computes").
"""

from __future__ import annotations

from typing import Optional

import numpy as np
import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.jobs.audit.canaries import Canaries
from sparse_dp.mechanisms.selection.preselection import Preselection

SCORES = ("loss", "row_movement", "step_alignment")
WHITE_BOX = ("row_movement", "step_alignment")


def own_rows(canary_ids: np.ndarray, training_ids: np.ndarray) -> np.ndarray:
  """``[m, T]``: whether canary ``j``'s row of table ``t`` is its alone."""
  own = np.empty(canary_ids.shape, bool)
  for t in range(canary_ids.shape[1]):
    _, inverse, counts = np.unique(canary_ids[:, t], return_inverse=True, return_counts=True)
    own[:, t] = (counts[inverse] == 1) & ~np.isin(canary_ids[:, t], training_ids[:, t])
  return own


def _tables(model, count: int) -> list[tf.Variable]:
  # pctr.build_pctr_model names table t's layer embedding_t.
  return [model.get_layer(f"embedding_{t}").embeddings for t in range(count)]


def _gathered(table_gradient, ids: np.ndarray, width: int) -> np.ndarray:
  """``[m, width]``: rows ``ids`` of a table's gradient (a tensor or ``IndexedSlices``)."""
  if table_gradient is None:
    return np.zeros((len(ids), width), np.float32)
  if not isinstance(table_gradient, tf.IndexedSlices):
    return tf.gather(table_gradient, ids).numpy()
  indices, values = table_gradient.indices.numpy(), table_gradient.values.numpy()
  order = np.argsort(ids, kind="stable")
  at = np.minimum(np.searchsorted(ids[order], indices), len(ids) - 1)
  found = ids[order][at] == indices
  rows = np.zeros((len(ids), width), np.float32)
  np.add.at(rows, order[at[found]], values[found])  # a shared id's sum lands on one canary
  return rows


class CanaryRows:
  """The canaries' own rows of a pCTR model: read, and their loss gradients, at any time.

  ``preselection`` maps the canaries' and the training examples' ids as the job does.
  """

  def __init__(self, canaries: Canaries, training_ids: np.ndarray,
               preselection: Optional[Preselection] = None):
    x, self.labels = canaries.inputs()
    if preselection is not None:
      x = {**x, "categorical": preselection.apply(x["categorical"])}
      training_ids = preselection.apply(training_ids)
    self.inputs = x
    self.ids = x["categorical"]
    self.own = own_rows(self.ids, training_ids)

  def read(self, model) -> np.ndarray:
    """``[m, sum_t d_t]``: each canary's own rows (0 where not its own), tables side by side."""
    return np.concatenate([tf.gather(table, self.ids[:, t]).numpy() * self.own[:, t:t + 1]
                           for t, table in enumerate(_tables(model, self.ids.shape[1]))], axis=1)

  def loss_gradients(self, model) -> tuple[np.ndarray, np.ndarray]:
    """``(losses [m], gradients [m, sum_t d_t])``: each canary's log-loss under ``model`` and
    its gradient on the canary's own rows (an own row is looked up by that canary alone,
    so the total loss's gradient there is the canary's)."""
    tables = _tables(model, self.ids.shape[1])
    with tf.GradientTape() as tape:
      logits = model(self.inputs, training=False)
      losses = tf.nn.sigmoid_cross_entropy_with_logits(tf.constant(self.labels), logits)[:, 0]
      total = tf.reduce_sum(losses)
    gradients = tape.gradient(total, tables)
    rows = [_gathered(g, self.ids[:, t], table.shape[1]) * self.own[:, t:t + 1]
            for t, (g, table) in enumerate(zip(gradients, tables))]
    return losses.numpy().astype(np.float64), np.concatenate(rows, axis=1)


class StepAlignment(keras.callbacks.Callback):
  """The ``step_alignment`` score, read at every training step (see the module's docstring)."""

  def __init__(self, rows: CanaryRows):
    super().__init__()
    self.rows = rows
    self.steps: list[np.ndarray] = []  # [m] per step: the update along each direction
    self.initial = self._before = self._direction = None

  def on_train_begin(self, logs=None):
    self.initial = self.rows.read(self.model)

  def on_train_batch_begin(self, batch, logs=None):
    _, gradients = self.rows.loss_gradients(self.model)
    norms = np.linalg.norm(gradients, axis=1, keepdims=True)
    self._direction = np.divide(gradients, norms, out=np.zeros_like(gradients),
                                where=norms > 0)
    self._before = self.rows.read(self.model)

  def on_train_batch_end(self, batch, logs=None):
    update = self.rows.read(self.model) - self._before
    self.steps.append(-np.sum(update * self._direction, axis=1))

  @property
  def score(self) -> np.ndarray:
    """``[m]``: the alignments summed over the steps."""
    return np.sum(self.steps, axis=0) if self.steps else np.zeros(len(self.rows.ids))


def canary_scores(model, rows: CanaryRows, alignment: StepAlignment) -> dict[str, np.ndarray]:
  """The scores of :data:`SCORES` for every canary (included or not) after training."""
  losses, _ = rows.loss_gradients(model)
  movement = np.linalg.norm(rows.read(model) - alignment.initial, axis=1)
  return {"loss": -losses, "row_movement": movement.astype(np.float64),
          "step_alignment": alignment.score.astype(np.float64)}
