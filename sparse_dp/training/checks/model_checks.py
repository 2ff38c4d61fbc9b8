"""Static refusals at ``make_private``: layers known to break per-example clipping, by name.

Part of the model validator (:mod:`sparse_dp.training.checks.validation`); the
separability probe (:mod:`sparse_dp.training.checks.separability`) covers the rest.
"""

from __future__ import annotations

from typing import Iterable

from sparse_dp._keras import keras
from sparse_dp.training.checks.preprocessing_checks import statistics_problems
from sparse_dp.training.dp_step.mixed_precision import loss_scaling_problems

_BATCH_NORMALIZATION = (keras.layers.BatchNormalization,
                        keras.layers.experimental.SyncBatchNormalization)

_RETRIEVAL_FIX = (
    "use negatives from a public candidate set instead: give each example K negative ids "
    "drawn independently of the data (e.g. tf.tile(public_ids[None], [batch, 1]) or uniform "
    "ids), look them up per example with the candidate tower (Embedding(combiner=None) on "
    "[batch, 1 + K] ids, the positive in column 0) and train on "
    "keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=NONE) with "
    "label 0; see docs/epsilon.md, 'Retrieval with public negatives'")


class ModelValidationError(ValueError):
  """A model or loss that DP training cannot make private as it stands.

  Raised by :func:`check_model` at ``make_private`` and by the separability probe on the
  first batch (:func:`~sparse_dp.training.checks.separability.check_separable`). The
  message names the layer or loss, and the fix.
  """


def check_model(model: keras.Model, public_layers: Iterable[str] = ()) -> None:
  """Refuses, by name and with the fix, the layers known to break per-example clipping.

  Looks at every layer, nested ones included, for:

  * a trainable ``BatchNormalization`` / ``SyncBatchNormalization``. In training mode it
    normalises each example by the batch's statistics (``l_i`` depends on every
    example) and writes them, un-noised, into its moving mean and variance. A frozen
    one (``layer.trainable = False``) runs in inference mode in Keras 2: a fixed map of
    each example, sound provided its moving statistics are public.
  * ``tfrs.tasks.Retrieval``: in-batch negatives (manual: *What the epsilon covers*,
    "Retrieval with public negatives").
  * any layer with an ``activity_regularizer``: a penalty computed from the batch's
    activations, added to the loss outside the per-example clipping.
  * a dynamic loss scale (:func:`~sparse_dp.training.dp_step.mixed_precision.loss_scaling_problems`;
    mixed precision with a fixed one trains) and ``TimeDistributed`` around a
    trainable layer (:func:`time_distributed_problems`).
  * preprocessing layers holding statistics of data, layers holding lookup tables, and
    non-trainable statistics away from their initial values (a frozen
    ``BatchNormalization`` warmed on data), unless named in ``public_layers``
    (:mod:`sparse_dp.training.checks.preprocessing_checks`).

  Args:
    model: the compiled model.
    public_layers: names of layers whose statistics or tables come from public data.

  Raises:
    ModelValidationError: one or more of these problems, each named with its fix.
  """
  problems = []
  for layer in model._flatten_layers(include_self=True):
    if isinstance(layer, _BATCH_NORMALIZATION) and layer.trainable:
      problems.append(
          f"{describe_layer(layer)} normalises each example by the statistics of its batch in "
          "training mode (one example's loss then depends on all the others) and stores the "
          "raw batch mean and variance, un-noised, in its moving statistics; remove it, use "
          "LayerNormalization(center=False, scale=False) (per-example statistics), or freeze "
          "it (layer.trainable = False: Keras then runs it in inference mode, a fixed map by "
          "its moving statistics, which must come from public data)")
    if _is_retrieval_task(layer):
      problems.append(
          f"{describe_layer(layer)} scores each query against the other examples' candidates "
          f"(in-batch softmax), so one example's loss depends on the others; {_RETRIEVAL_FIX}")
    if getattr(layer, "activity_regularizer", None) is not None:
      problems.append(
          f"{describe_layer(layer)} has an activity_regularizer, a penalty computed from the "
          "batch's activations that per-example clipping does not cover; remove it, or "
          "regularise the weights instead (kernel_regularizer, added after the noise)")
  problems += loss_scaling_problems(model.optimizer, model) + time_distributed_problems(model)
  problems += statistics_problems(model, public_layers)
  if problems:
    raise ModelValidationError("sparse-dp cannot train this model privately:\n* " +
                               "\n* ".join(problems))


def time_distributed_problems(model: keras.Model) -> list[str]:
  """``TimeDistributed`` around a trainable layer, whose rows are ``batch * T``, not examples."""
  problems = []
  for layer in model._flatten_layers(include_self=True):
    if not isinstance(layer, keras.layers.TimeDistributed) or not layer.trainable_weights:
      continue
    inner = layer.layer
    fix = ("drop the TimeDistributed wrapper: a Dense applied to a [batch, T, k] input acts on "
           "each of the T vectors and DP training clips it per example as it is"
           if isinstance(inner, keras.layers.Dense) else
           "apply the layer to each example's [T, ...] tensor without folding T into the batch "
           "(a Dense takes [batch, T, k] directly)")
    problems.append(
        f"{describe_layer(layer)} reshapes its input [batch, T, ...] to [batch * T, ...] "
        f"before calling {describe_layer(inner)}, so that layer's rows are not the examples "
        f"and its per-example gradients cannot be charged to them; {fix}")
  return problems


def describe_layer(layer: keras.layers.Layer) -> str:
  return f"layer '{layer.name}' ({type(layer).__name__})"


def _is_retrieval_task(layer) -> bool:
  try:
    import tensorflow_recommenders as tfrs
  except ImportError:
    return False
  return isinstance(layer, tfrs.tasks.Retrieval)
