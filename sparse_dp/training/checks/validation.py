"""Refuses models with non-separable examples before any DP step (Opacus ``ModuleValidator`` style).

DP-SGD's guarantee rests on one bound: adding or removing one example moves the clipped
gradient sum ``G(D) = sum_i [grad l_i]_C2`` by at most ``C2`` (Ghazi et al., NeurIPS 2023,
Algorithm 1; Abadi et al., CCS 2016). The DP step makes each ``l_i`` a function of example
``i`` alone by construction (:mod:`sparse_dp.training.dp_step.per_example`) and refuses a
forward pass that writes state (:mod:`sparse_dp.training.dp_step.state_writes`); a model whose
layers mix examples then keeps the bound but does not train as written. Two checks refuse such
models first, naming the layer or loss and the fix:

* :func:`check_model` (:mod:`.model_checks`), static, at ``make_private``: BatchNormalization
  in training mode, ``tfrs.tasks.Retrieval``, ``activity_regularizer``;
* :func:`check_separable` (:mod:`.separability`), a probe run once on the first batch, for
  any model and loss. See docs/epsilon.md ("Each example alone", with the Retrieval model on
  public negatives).
"""

from sparse_dp.training.checks.model_checks import ModelValidationError, check_model
from sparse_dp.training.checks.separability import PROBE_SIZE, check_separable

__all__ = ["ModelValidationError", "PROBE_SIZE", "check_model", "check_separable"]
