"""``fit``, ``train_on_batch``, ``compile`` of a private model, as ``make_private`` installs them.

Each wraps Keras's own method so that what it cannot see is checked first:

* ``fit`` tells the DP step whether it is fed the run's Poisson batches,
  probes the first batch for separability, and refuses validation data
  (``val_loss`` is not noised);
* ``train_on_batch`` probes its batch (it is never a Poisson sample of ours);
* ``compile`` keeps a recompiled model private: the optimizer becomes the
  sparse one again, the new loss must be per example, and the next batch is
  probed again.
"""

from __future__ import annotations

import collections.abc
import inspect
import itertools
import types
import warnings
from typing import Optional

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.distribute import parameter_servers, workers
from sparse_dp.layers import embedding_backends
from sparse_dp.layers.embedding_backends.hardware import TRAINER_ONLY
from sparse_dp.optimizers import sparse_optimizer
from sparse_dp.training.checks.model_checks import ModelValidationError
from sparse_dp.training.dp_step import mixed_precision, run_statistics, update_guard
from sparse_dp.training.dp_step.losses import per_example_loss_fn
from sparse_dp.training.poisson import padded_batches
from sparse_dp.training.poisson.poisson_sampling import head
from sparse_dp.training.wrappers import host_guards
from sparse_dp.training.wrappers.callbacks import NOT_POISSON_KEY
from sparse_dp.training.wrappers.private_training import PrivateTraining

# Batches of a non-Poisson input the separability probe tries before giving up
# for this fit (a batch of fewer than 2 examples cannot show a coupling).
_PROBE_BATCHES = 3


def install(training: PrivateTraining) -> None:
  """Replaces the model's ``fit``, ``train_on_batch`` and ``compile`` by the private ones,
  and makes ``evaluate`` log mean losses."""
  model = training.model
  model.fit = types.MethodType(_private_fit(training), model)
  model.train_on_batch = types.MethodType(_private_train_on_batch(training), model)
  model.compile = types.MethodType(_private_compile(training), model)
  for name in ("load_weights", "set_weights"):
    setattr(model, name, types.MethodType(_restoring(training, name), model))
  for name in ("save", "save_weights"):
    setattr(model, name, types.MethodType(_checked_save(training, name), model))
  _evaluate_with_mean_losses(model)


# What a tfrs.Model's test_step logs of its compute_loss (tfrs.Model.test_step).
_LOSS_LOGS = ("loss", "regularization_loss", "total_loss")


def _evaluate_with_mean_losses(model: keras.Model) -> None:
  """``evaluate`` logs each batch's mean loss.

  The DP step needs a loss per example: a ``tfrs.Model``'s task has reduction NONE, and its
  ``test_step`` logs that vector whole, which Keras's progress bar fails to average with a
  last, smaller batch. The mean is what the model would log with its task's default
  reduction. Test data only: ``fit`` logs no loss of the private batches.
  """
  test_step = model.test_step

  def mean_losses(data):
    return {name: tf.reduce_mean(value) if name in _LOSS_LOGS else value
            for name, value in test_step(data).items()}
  model.test_step = mean_losses
  model.test_function = None


def _restoring(training: PrivateTraining, name: str):
  """``load_weights``/``set_weights`` that take the loaded weights as the DP step's only if
  the DP record they bring describes them.

  The layers' DP records come with the weights (the state follows the weights,
  :mod:`sparse_dp.training.dp_state.state`); weights without a matching record leave the
  fingerprint (:mod:`sparse_dp.training.dp_state.weight_fingerprint`) at the DP step's, so
  the epsilon is refused (:meth:`PrivateTraining.adopt_loaded_weights`).
  """
  method = getattr(type(training.model), name)

  def restoring(self, *args, **kwargs):
    result = method(self, *args, **kwargs)
    training.adopt_loaded_weights()
    return result

  return restoring


def _checked_save(training: PrivateTraining, name: str):
  """``save``/``save_weights`` that refuse weights moved outside the DP step: a saved model
  carries its DP record, which must describe the weights saved with it."""
  method = getattr(type(training.model), name)

  def checked_save(self, *args, **kwargs):
    training.check_weights()
    return method(self, *args, **kwargs)

  return checked_save


def unnest_tpu_step(model: keras.Model) -> None:
  """Under a ``TPUStrategy``, turns Keras's ``jit_compile`` off: the TPU compiles the step.

  With ``jit_compile=True`` Keras wraps the train step in a ``tf.function(jit_compile=True)``
  inside ``strategy.run``. On a TPU that nesting buys nothing (the replicated program is
  compiled whole) and breaks ``TPUEmbeddingV2``: its enqueue refuses to be traced in a
  function nested in ``strategy.run`` (``_raise_error_for_incorrect_control_flow_context``).
  The step still takes its XLA branches, and ``fit`` its host guards
  (``PrivateTraining.compiled_by_xla``).
  """
  if embedding_backends.on_tpu(model.distribute_strategy):
    model.jit_compile = False


def check_steps_per_execution(model: keras.Model, epsilon_budget: Optional[float],
                              steps_per_execution=None) -> None:
  """Refuses ``steps_per_execution`` other than 1 when an epsilon budget must stop training.

  ``steps_per_execution``: the value about to be compiled; default: the
  model's compiled one. Keras runs that many steps in one graph call and calls
  the callbacks only after it, so training cannot stop between them: a call
  that crosses the budget's last step fails inside the graph (the DP step
  refuses to run past the budget) instead of stopping cleanly. Without a
  budget every step is counted and accounted as usual.
  """
  if steps_per_execution is None:
    compiled = getattr(model, "_steps_per_execution", None)
    steps_per_execution = ("auto" if getattr(model, "_autotune_steps_per_execution", False)
                           else 1 if compiled is None else int(compiled.numpy()))
  if epsilon_budget is None or steps_per_execution == 1:
    return
  raise ValueError(
      f"sparse-dp: compile(steps_per_execution={steps_per_execution!r}) with an epsilon budget "
      f"({epsilon_budget:g}): Keras runs that many steps before any callback, so training "
      "cannot stop at the budget's last step. Compile with steps_per_execution=1 (the "
      "default), or drop DPConfig(epsilon_budget=...) and watch private.epsilon()")


def _private_compile(training: PrivateTraining):
  """``compile`` that redoes what ``make_private`` did to the compiled parts.

  Keras's ``compile`` replaces the optimizer and the loss. Before it runs, the
  new optimizer is made sparse (:func:`sparse_optimizer`, refusing one with no
  sparse form), its fixed loss scale taken for the step and a dynamic one
  refused (:mod:`~sparse_dp.training.dp_step.mixed_precision`), and
  ``steps_per_execution`` is checked; after it, the new loss is derived per
  example (refusing a reduced or multi-output loss), and the separability
  probe is reset: the next ``fit`` or ``train_on_batch`` probes
  its first batch, as after ``make_private``, so a loss that couples the
  examples is refused before any step.
  """
  compile_ = type(training.model).compile
  signature = inspect.signature(compile_)

  def private_compile(self, *args, **kwargs):
    call = signature.bind(self, *args, **kwargs)
    check_steps_per_execution(self, training.epsilon_budget,
                              call.arguments.get("steps_per_execution") or 1)
    optimizer = keras.optimizers.get(call.arguments.get("optimizer", "rmsprop"))
    problems = mixed_precision.loss_scaling_problems(optimizer, self)
    if problems:
      raise ModelValidationError(f"sparse-dp cannot train this model privately: {problems[0]}")
    inner, loss_scale = mixed_precision.split_loss_scale(optimizer)
    private_optimizer = update_guard.guard(sparse_optimizer(inner), self.name)
    # A LossScaleOptimizer goes to Keras as it is: Keras would wrap its inner one again.
    scaled = isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
    call.arguments["optimizer"] = optimizer if scaled else private_optimizer
    compile_(*call.args, **call.kwargs)
    unnest_tpu_step(self)
    self.optimizer, training.loss_scale = private_optimizer, loss_scale  # the step scales
    training.require_probe()
    per_example_loss_fn(self)

  return private_compile


def _private_fit(training: PrivateTraining):
  """``fit`` that tells the step whether its input is this run's Poisson batches.

  Anything else (arrays with a ``batch_size``, a user's dataset, a Poisson
  dataset through ``map``/``unbatch``/``filter``/``cache``/...) is "not
  Poisson": its steps are counted in ``non_poisson_steps`` and checked against
  the expected batch size. The first batch is probed for separability before
  the first step. Under a multi-worker strategy, every worker must be about to
  draw the same first Poisson batch (:func:`workers.refuse_different_batches`),
  which ``fit`` must split exactly among the replicas (:func:`workers.refuse_unsliced_batches`).
  """
  fit = type(training.model).fit
  signature = inspect.signature(fit)

  def private_fit(self, *args, **kwargs):
    parameter_servers.refuse_keras_fit(self)
    _refuse_engine_tables(training)
    call = signature.bind(self, *args, **kwargs)
    _check_no_validation(call.arguments, training)
    x = call.arguments.get("x")
    training.sync_with_state()
    training.check_weights()  # more steps would not make weights moved outside DP private
    training.create_optimizer_weights()  # the train function is then traced once
    poisson = training.feeds_poisson(x)
    if not poisson:
      _warn_if_transformed(training.transformations_to(x))
    compiled = training.compiled_by_xla  # the step's asserts are compiled away
    if compiled:
      _refuse_uncompilable_optimizer(self.optimizer)
      _refuse_uncompilable_inputs(x)
    if not training.separability_checked:
      call.arguments["x"] = _probe(training, x, call.arguments)
    if workers.is_multi_worker(self.distribute_strategy):  # after the probe's pass
      workers.refuse_different_batches(self.distribute_strategy,
                                       training.next_batch_fingerprint(x))
      if poisson:
        workers.refuse_unsliced_batches(x)
    if compiled:
      if not poisson:
        call.arguments["x"] = _host_checked(training, call.arguments["x"], call.arguments)
      else:
        _warn_if_unpadded(x, self.distribute_strategy.num_replicas_in_sync)
    guards = [host_guards.HostGuards(training)] if compiled else []
    call.arguments["callbacks"] = _with_run_progress_bar(
        [_EngineTablesCopy(training.embedding_backend), *guards,
         *(call.arguments.get("callbacks") or [])],
        call.arguments.get("verbose", "auto"))
    training.run_statistics.reset()
    training.feeding_poisson = poisson
    training.poisson_input.assign(poisson)
    try:
      return fit(*call.args, **call.kwargs)
    finally:
      training.feeding_poisson = False
      training.poisson_input.assign(False)
      training.embedding_backend.sync_tables()

  return private_fit


class _EngineTablesCopy(keras.callbacks.Callback):
  """Copies the tables an embedding engine trains into the Keras tables (``sync_tables``)
  before a validation pass and at each epoch's end (``ModelCheckpoint`` saves them then);
  ``fit`` copies them again when it ends, also on an error. The SparseCore backend's step
  never touches them; the engine double's keeps them equal (the copy changes nothing)."""

  def __init__(self, backend):
    super().__init__()
    self.backend = backend

  def on_test_begin(self, logs=None):
    self.backend.sync_tables()

  def on_epoch_end(self, epoch, logs=None):
    self.backend.sync_tables()


def _with_run_progress_bar(callbacks: list, verbose) -> list:
  """``callbacks`` with a progress bar that shows the run's values as logged.

  Keras's bar averages every logged value over the epoch's steps, but for
  ``epsilon`` (spent so far) and the run's gradient size
  (:data:`~sparse_dp.training.dp_step.run_statistics.LOGGED`) the last step's value is the
  run's. It goes last, so that its epoch line shows the exact epsilon
  :class:`~sparse_dp.training.wrappers.callbacks.PrivacyCallback` sets at the epoch's end.
  A progress bar the user passed is kept as it is.
  """
  if verbose == 0 or any(
      isinstance(c, keras.callbacks.ProgbarLogger) for c in callbacks):
    return callbacks
  stateful = ("epsilon", NOT_POISSON_KEY) + run_statistics.LOGGED
  return callbacks + [keras.callbacks.ProgbarLogger(count_mode="steps", stateful_metrics=stateful)]


def _refuse_engine_tables(training: PrivateTraining) -> None:
  """Keras cannot train tables held by the V1 TPU embedding engine (``embedding='tpu'``)."""
  if training.embedding_choice.name == "tpu":
    raise RuntimeError(TRAINER_ONLY)


def _check_no_validation(arguments: dict, training: PrivateTraining) -> None:
  """Refuses ``validation_data``/``validation_split`` unless ``debug_metrics`` is on.

  Keras logs ``val_loss`` and the validation metrics, un-noised functions of
  the validation examples (with ``validation_split``, of the training data
  itself), which the epsilon does not cover.
  """
  if training.config.debug_metrics:
    return
  given = ("validation_data" if arguments.get("validation_data") is not None
           else "validation_split" if arguments.get("validation_split") else None)
  if given:
    raise ValueError(
        f"sparse-dp: fit({given}=...) logs val_loss and validation metrics computed without "
        "noise from that data, which the epsilon does not cover. Evaluate with "
        "model.evaluate(...) on data you may release, or set DPConfig(debug_metrics=True), "
        "which the privacy report marks as not private")


def _refuse_uncompilable_optimizer(optimizer) -> None:
  """Keras's legacy Adagrad applies sparse updates with a kernel XLA does not have."""
  if isinstance(optimizer, keras.optimizers.legacy.Adagrad):
    raise ValueError(
        "sparse-dp: Adagrad's sparse update (ResourceSparseApplyAdagradV2) has no XLA kernel, "
        "so a step XLA compiles (jit_compile=True, or on a TPU) cannot train with it; use "
        "sparse_dp.optimizers.RowwiseAdagrad (--optimizer rowwise-adagrad), SGD or Adam "
        "(sparse_dp.optimizers.LazyAdam), or off TPU compile without jit_compile")


def _refuse_uncompilable_inputs(x) -> None:
  """Ragged and sparse inputs: the per-example step maps over their rows
  (``tf.map_fn``, ``RaggedTensorToVariant``), which XLA has no kernel for."""
  spec = x.element_spec if isinstance(x, tf.data.Dataset) else x
  kinds = (tf.RaggedTensor, tf.SparseTensor, tf.RaggedTensorSpec, tf.SparseTensorSpec)
  if any(isinstance(part, kinds) for part in tf.nest.flatten(spec, expand_composites=False)):
    raise ValueError(
        "sparse-dp: a model whose step XLA compiles (jit_compile=True, or on a TPU) is fed "
        "ragged or sparse inputs; the DP step computes each example alone by mapping over "
        "their rows, which XLA cannot compile (no XLA kernel for RaggedTensorToVariant). Feed "
        "dense ids of one fixed length per feature, or off TPU compile without jit_compile "
        "(the graph-mode step takes ragged and sparse ids)")


def _leading_size(x) -> int:
  """Examples in ``train_on_batch``'s ``x``: the leading size of its first part."""
  first = tf.nest.flatten(x, expand_composites=False)[0]
  if isinstance(first, tf.RaggedTensor):
    return int(first.nrows())
  return int(first.shape[0]) if getattr(first, "shape", None) is not None else len(first)


def _host_checked(training: PrivateTraining, x, arguments: dict):
  """``fit``'s non-Poisson input with its batch sizes checked on the host (for XLA).

  A compiled step's own batch-size assert is compiled away; a ``tf.data``
  input gets the check in its pipeline, arrays by their ``batch_size``.
  """
  if isinstance(x, tf.data.Dataset):
    return host_guards.checked_batches(training, x)
  if isinstance(x, (keras.utils.Sequence, collections.abc.Iterator)):
    raise ValueError(
        "sparse-dp: a model whose step XLA compiles (jit_compile=True, or on a TPU) is fit on "
        "a generator or a "
        "keras.utils.Sequence, whose batch sizes cannot be checked outside the compiled step. "
        "Feed private.poisson_dataset(...), a tf.data.Dataset, or arrays with batch_size")
  host_guards.refuse_batch_size(training, arguments.get("batch_size") or 32)
  return x


def _warn_if_unpadded(dataset: tf.data.Dataset, replicas: int) -> None:
  """Says that XLA compiles the step once per batch size of an unpadded Poisson dataset;
  refuses one on several replicas, which XLA compiles one program for."""
  if padded_batches.is_padded(dataset.element_spec):
    return
  unpadded = ("sparse-dp: this model's step is compiled by XLA (jit_compile=True, or on a "
              "TPU) and fed Poisson batches of varying sizes")
  fix = ("Make the dataset after compile, or pass poisson_dataset(..., padded=True): every "
         "batch then has one size, with an example mask")
  if replicas > 1:
    raise ValueError(f"{unpadded}, which {replicas} replicas cannot split into one static "
                     f"shape for their one program. {fix}")
  warnings.warn(f"{unpadded}, so XLA compiles the DP step again for each new batch size. {fix}",
                stacklevel=3)


def _warn_if_transformed(transformations: Optional[list[str]]) -> None:
  """Says why a transformed Poisson dataset is counted as not Poisson, and the fix."""
  if not transformations:
    return
  warnings.warn(
      f"sparse-dp: fit is fed a Poisson dataset through {', '.join(transformations)}: its "
      "batches are not known to be the Poisson samples (a map, unbatch or filter can copy, mix "
      "or drop examples across rows), so these steps are counted as not Poisson "
      "(epsilon_not_poisson, batch sizes checked). Transform the examples before sampling, "
      "poisson_dataset(f(x), y), and feed fit the Poisson dataset itself (prefetch, take and "
      "repeat are fine)", stacklevel=3)


def _private_train_on_batch(training: PrivateTraining):
  """``train_on_batch``: never Poisson-sampled by us; its batch is probed first. An
  engine's tables are copied into the Keras tables after it (``sync_tables``)."""
  train_on_batch = type(training.model).train_on_batch

  def private_train_on_batch(self, x, y=None, sample_weight=None, class_weight=None,
                             reset_metrics=True, return_dict=False):
    parameter_servers.refuse_keras_fit(self)
    _refuse_engine_tables(training)
    if training.compiled_by_xla:  # the step's asserts are compiled away
      _refuse_uncompilable_inputs(x)
      host_guards.refuse_past_budget(training)
      host_guards.refuse_batch_size(training, _leading_size(x))
    training.check_separable(keras.utils.pack_x_y_sample_weight(x, y, sample_weight))
    training.create_optimizer_weights()
    try:
      logs = train_on_batch(self, x, y, sample_weight, class_weight, reset_metrics,
                            return_dict=True)
    finally:
      training.embedding_backend.sync_tables()
    host_guards.refuse_compiled_step_flags(logs)  # the step's flags never reach the user
    if return_dict:
      return logs
    names = self.metrics_names
    values = ([logs[name] for name in names if name in logs]
              + [logs[key] for key in sorted(logs) if key not in names])
    return values[0] if len(values) == 1 else values

  return private_train_on_batch


def _probe(training: PrivateTraining, x, arguments: dict):
  """Runs the separability probe on ``fit``'s first batch; returns ``x`` to train on.

  The user's data is not consumed: a dataset is read by a fresh iterator (a
  Poisson dataset's probe batch is a sample of its own, never trained on), a
  ``Sequence`` by index, a generator's first element is put back, and arrays
  give their first ``batch_size`` rows.
  """
  if x is None:
    return x
  if isinstance(x, tf.data.Dataset):
    for batch in itertools.islice(x, _PROBE_BATCHES):
      if training.check_separable(batch):
        break
    return x
  if isinstance(x, keras.utils.Sequence):
    training.check_separable(x[0])
    return x
  if isinstance(x, collections.abc.Iterator):
    first = next(x)
    training.check_separable(first)
    return itertools.chain([first], x)
  rows = arguments.get("batch_size") or 32
  training.check_separable(keras.utils.pack_x_y_sample_weight(
      *(None if part is None else head(part, rows)
        for part in (x, arguments.get("y"), arguments.get("sample_weight")))))
  return x
