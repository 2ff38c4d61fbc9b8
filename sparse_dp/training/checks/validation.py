"""Refuses models with non-separable examples before any DP step (Opacus ``ModuleValidator`` style).

DP-SGD's guarantee rests on one bound: adding or removing one example moves
the clipped gradient sum ``G(D) = sum_i [grad l_i]_C2`` by at most ``C2``
(Ghazi et al., NeurIPS 2023, Algorithm 1; Abadi et al. 2016). Per-example clipping gives that
bound only when

* example ``i``'s loss ``l_i`` is a function of example ``i``'s data alone, so
  that removing example ``j`` removes the one term ``[grad l_j]_C2`` and
  leaves the others unchanged; and
* the forward pass writes nothing learned from the batch into state that is
  released without noise (BatchNormalization's moving mean is the raw mean of
  the private batch).

The DP step makes the first point hold by construction: it computes each
example's loss and gradients with that example alone
(:mod:`sparse_dp.training.dp_step.per_example`), and refuses a forward pass that
writes state (:mod:`sparse_dp.training.dp_step.state_writes`). A model whose layers
mix examples then no longer breaks the bound, but it does not train as
written: its ``BatchNormalization`` normalises one example, its in-batch
softmax has no negatives. (Over the whole batch, as DP steps that are not
per-example compute it, measured with zero noise and ``C2 = 1``:
``||G(D + z) - G(D)||`` is 62 with ``BatchNormalization`` in training mode,
78 with a ``Lambda`` that subtracts the batch mean, 12-59 with TFRS's
``Retrieval`` task.) Two checks refuse such models first, naming the layer or
loss and the fix:

* :func:`check_model` (:mod:`.model_checks`), static, at ``make_private``:
  BatchNormalization in training mode, ``tfrs.tasks.Retrieval``,
  ``activity_regularizer``.
* :func:`check_separable` (:mod:`.separability`), a probe run once on the
  first batch: for any model and loss, including custom layers, ``Lambda``s,
  random layers (their noise fixed per example) and state held anywhere the
  model tracks.

**Retrieval with public negatives.** ``tfrs.tasks.Retrieval`` scores each
query against the other examples' candidates, so ``l_i`` depends on example
``j``'s candidate. A separable alternative scores each query against its own
positive and against ``K`` negatives drawn independently of the data (the
same public candidate list for everyone, or ids sampled uniformly from the
vocabulary), looked up *per example* so that clipping charges every lookup to
its example::

  class PublicNegativesRetrieval(tfrs.Model):
    def compute_loss(self, features, training=False):
      query = self.query_tower(features["user"])                        # [B, d]
      negatives = tf.tile(PUBLIC_IDS[None], [tf.shape(query)[0], 1])     # [B, K], data-independent
      candidates = self.item_tower(                                      # [B, 1 + K, d]; its
          tf.concat([features["item"][:, None], negatives], axis=1))     # Embedding: combiner=None
      logits = tf.einsum("bd,bkd->bk", query, candidates)
      return self.softmax_loss(tf.zeros_like(logits[:, 0], tf.int64), logits)  # positive: column 0
      # self.softmax_loss = SparseCategoricalCrossentropy(from_logits=True, reduction=NONE)

(``tests/keras_models.py`` has a runnable one.)
"""

from sparse_dp.training.checks.model_checks import ModelValidationError, check_model
from sparse_dp.training.checks.separability import PROBE_SIZE, check_separable

__all__ = ["ModelValidationError", "PROBE_SIZE", "check_model", "check_separable"]
