"""Train the pCTR model with one algorithm and evaluate it on held-out examples.

Shared by ``sparse-dp train`` (every algorithm of ``--compare`` sees the same
encoded examples and split) and ``sparse-dp stream`` (one call per period,
warm-started from the previous period). DP-FEST and DP-AdaFEST+ take a
:class:`Preselection` the caller has made and paid for (``preselect``: a
private top-k over the training counts; a stream may reuse one across
periods); on the preselected tables they train as DP-SGD and DP-AdaFEST.
``settings.epsilon`` is the training's own epsilon and
``settings.selection_epsilon`` the preselection's, made for this run; both are
charged in the model's DP record, so the epsilon in the Keras logs and the
metrics' ``epsilon`` include them (and any warm-started earlier runs);
``training_epsilon`` is the Gaussian steps' part. Gradient-size reduction is
measured against the tables before any preselection (rows of the full vocabulary / rows a step
updates), so the algorithms are compared on one scale.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import sys
import time
from typing import Callable, Optional, Sequence

import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.accounting import Algorithm, BatchSchedule, calibrate, steps_for_epochs
from sparse_dp.accounting.adafest_defaults import adafest_settings
from sparse_dp.accounting.report import NOT_POISSON
from sparse_dp.distribute import ParameterServerTraining
from sparse_dp.distribute.local_cluster import strategy_named
from sparse_dp.distribute.parameter_servers import is_parameter_server
from sparse_dp.jobs.job_output import Phases
from sparse_dp.jobs.sample.batches import SampledBatches
from sparse_dp.jobs.train import private_calibration
from sparse_dp.jobs.train.job_flags import FitSettings, check_batch_fits, named_tables
from sparse_dp.jobs.train.step_clock import StepClock
from sparse_dp.layers import embedding_backends
from sparse_dp.mechanisms.selection.preselection import Preselection, preselect_buckets
from sparse_dp.mechanisms.selection.top_k import bucket_counts
from sparse_dp.models.calibration import Reliability, calibration_metrics
from sparse_dp.models.pctr import HIDDEN_UNITS, build_pctr_model, embedding_dim, table_ids
from sparse_dp.models.pctr_data import StreamedExamples
from sparse_dp.optimizers import LazyAdam, RowwiseAdagrad
from sparse_dp.training import DPConfig, make_private
from sparse_dp.training.config import dense_table_names
from sparse_dp.training.poisson.poisson_sampling import head
from sparse_dp.training.tpu_loop import ONE_ENGINE_ROUTE, TPUTrainer
from sparse_dp.training.wrappers.callbacks import NOT_POISSON_KEY


@dataclasses.dataclass
class FitResult:
  metrics: dict
  history: dict
  model: keras.Model
  reliability: Reliability  # of the held-out predictions (models.calibration)


def fit_and_evaluate(algorithm: str, settings: FitSettings, train, held_out,
                     vocabulary_sizes, preselection: Optional[Preselection] = None,
                     initial_weights: Optional[Callable[[keras.Model], None]] = None,
                     progress: bool = True,
                     observers: Sequence[keras.callbacks.Callback] = (),
                     phases: Optional[Phases] = None) -> FitResult:
  """Trains on ``train``, evaluates on ``held_out = (x, y)``; returns the job's metrics.

  ``train`` is ``(x, y)`` in memory (Poisson-sampled batches when private),
  :class:`StreamedExamples` (shuffled fixed-size batches from ``tf.data``) or
  :class:`SampledBatches` (the Poisson batches of ``sparse-dp sample``, one per
  step, ``settings.epochs * q`` of them, accounted at the sample's ``q``, ``N``
  and truncation).

  ``initial_weights(model)``, if given, loads weights into the built model.
  ``observers`` are Keras callbacks that read the model at every step (the audit's
  per-step white-box view, :mod:`sparse_dp.jobs.audit.scores`); ``--strategy ps`` runs none.
  ``progress=False`` keeps Keras's per-epoch lines (the training loss) off stdout:
  a caller whose run is not the released one (a non-private teacher) must not
  print statistics of un-noised private data. ``phases`` times the model's making, the
  training and the evaluation.
  """
  # A bar within each epoch where someone watches (a terminal), a line per epoch elsewhere.
  verbose = (1 if sys.stdout.isatty() else 2) if progress else 0
  kind = Algorithm.parse(algorithm)
  if kind.uses_top_k_selection != (preselection is not None):
    raise ValueError(f"algorithm {kind.value!r} " + (
        "needs a preselection" if kind.uses_top_k_selection else "takes no preselection"))
  trained_as = _TRAINED_AS.get(kind, kind)
  streamed = isinstance(train, StreamedExamples)
  sampled = isinstance(train, SampledBatches)
  x_eval, y_eval = held_out
  num_examples = train.num_examples if streamed or sampled else len(train[1])
  check_batch_fits(settings.batch_size, num_examples)
  batch_size = settings.batch_size
  full_rows = float(sum(vocabulary_sizes))
  sizes = list(vocabulary_sizes)
  if preselection is not None:
    sizes = list(preselection.vocabulary_sizes)
    x_eval = kept_buckets(x_eval, preselection)
  keras.utils.set_random_seed(settings.seed)
  if settings.strategy == "ps" and (streamed or sampled or not kind.is_private):
    raise ValueError("--strategy ps trains a DP model on in-memory examples (--reader pandas) "
                     "with ParameterServerTraining; use another --strategy for --reader "
                     "tfdata/batches or --algorithm none")
  strategy = strategy_named(settings.strategy, settings.tpu)
  on_ps = is_parameter_server(strategy)
  # Tables a TPU embedding engine (V1, SparseCore) trains keep their Keras copy on the host.
  in_engine = (kind.is_private and embedding_backends.choose_backend(
      settings.embedding, strategy, kind.noises_every_row).name in ("tpu", "sparsecore"))
  with _phase(phases, "model and make_private"), strategy.scope():
    dims = embedding_dims(vocabulary_sizes, settings)
    model = build_pctr_model(sizes, settings.hidden_units or HIDDEN_UNITS, embedding_dims=dims,
                             table_placement="host" if in_engine else "default_device")
    if initial_weights is not None:
      initial_weights(model)
    # On a TPU the step counts as compiled whatever jit_compile says (compiled_by_xla).
    model.compile(optimizer=job_optimizer(settings.optimizer, settings.learning_rate),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  jit_compile=settings.jit_compile)
    # A run that paid for its preselection charges it under its own name.
    charged_as = kind if settings.selection_epsilon > 0 else trained_as
    config = _dp_config(charged_as, settings, num_examples, batch_size, sizes)
    private = make_private(
        model, config, num_examples=num_examples, batch_size=batch_size, epochs=settings.epochs,
        embedding=settings.embedding, input_ids=table_ids,
        max_batch_size=train.manifest.max_batch_size if sampled else None)
  if settings.embedding == "auto":
    print(f"sparse-dp: {private.embedding_choice.describe('auto')}", file=sys.stderr, flush=True)
  if private.embedding_choice.name == "tpu" and observers:
    raise ValueError("the audit's per-step observers are Keras callbacks, and tables in the "
                     "TPU embedding engine train in TPUTrainer's loop: use --embedding cpu")
  clock = StepClock(phases.job if phases is not None and progress else None)
  callbacks = ([private.callback()] if private.is_private else []) + list(observers) + [clock]
  if progress:
    callbacks.append(_progress_bar())
  with _phase(phases, "training"):
    start = time.perf_counter()
    steps, history = _train(private, settings, train, preselection, callbacks, verbose,
                            (num_examples, batch_size), strategy, held_out)
    seconds = time.perf_counter() - start
  with _phase(phases, "evaluation"):
    if private.is_private:
      # This run's steps (a budget may stop it early; warm-started weights carry earlier runs).
      steps = int(private.steps_taken.numpy()) - private.run.first_step
    report = private.report() if private.is_private else None
    # Host tables (engine-trained) and parameter-server weights are read outside TPU programs.
    logits = (model.predict(x_eval, batch_size=8192, verbose=0) if not (on_ps or in_engine)
              else tf.concat([model(batch, training=False) for batch in
                              tf.data.Dataset.from_tensor_slices(x_eval).batch(8192)], 0))
    auc = _auc(y_eval, logits)
    # Log-loss against the base rate's, ECE: held-out statistics, reported as AUC is.
    calibration, reliability = calibration_metrics(logits, y_eval)
  # The update's size over every step of the run (run_statistics), against the full tables.
  full_coordinates = float(sum(v * d for v, d in zip(vocabulary_sizes, dims)))
  run = (private.run_statistics.result() if private.is_private else
         {"nonzero_rows": full_rows, "nonzero_rows_min": full_rows,
          "nonzero_rows_max": full_rows, "nonzero_coordinates": full_coordinates})
  nonzero_rows = run["nonzero_rows"]
  metrics = {
      "algorithm": kind.value, "embedding": private.embedding_backend.name,
      "optimizer": settings.optimizer, "learning_rate": settings.learning_rate,
      "auc": auc,
      **calibration,
      "epsilon": report.epsilon if report else None,
      "training_epsilon": report.training_epsilon if report else None,
      "delta": private.delta if private.is_private else None,
      "steps": steps, "examples_per_second": steps * batch_size / seconds,
      **clock.rates(start, start + seconds, steps, batch_size),
      "gradient_size_reduction": (None if nonzero_rows is None
                                  else full_rows / max(nonzero_rows, 1.0)),
      "nonzero_rows_per_step": nonzero_rows,
      "nonzero_rows_per_step_min": run["nonzero_rows_min"],
      "nonzero_rows_per_step_max": run["nonzero_rows_max"],
      "nonzero_coordinates_per_step": run["nonzero_coordinates"],
      "train_examples": num_examples, "eval_examples": len(y_eval),
      "noise_multipliers": _noise_multipliers(private),
      "threshold": (config.threshold_for(private.spec.sigma1)
                    if trained_as.uses_contribution_map else None),
      **{name: getattr(config, name) if trained_as.uses_contribution_map else None
         for name in ("threshold_sigmas", "sigma_ratio")},
      "dense_tables": (sorted(private.step_noise.dense_tables)
                       if trained_as.uses_contribution_map else None),
      "poisson_sampling": report.poisson_sampling if report else None,
  }
  return FitResult(metrics, history, model, reliability)


def _train(private, settings: FitSettings, train, preselection, callbacks: list, verbose: int,
           sizes: tuple[int, int], strategy, held_out) -> tuple[Optional[int], dict]:
  """The training of :func:`fit_and_evaluate`: ``(steps, history)``; ``steps`` is ``None``
  where the private model counts them."""
  num_examples, batch_size = sizes
  steps, on_ps, model = None, is_parameter_server(strategy), private.model
  sampled, streamed = isinstance(train, SampledBatches), isinstance(train, StreamedExamples)
  if sampled:
    steps = steps_for_epochs(settings.epochs, batch_size / num_examples)
    # Probed on held-out rows: no sampled batch is spent on the separability probe.
    private.check_separable(head(held_out, min(64, len(held_out[1]))))
    batches = private.presampled_dataset(train.dataset(steps, strategy), num_examples,
                                         batch_size / num_examples, train.manifest.max_batch_size)
    history = _fit_batches(private, batches.prefetch(2), callbacks, verbose)
  elif streamed:
    steps = (steps_for_epochs(settings.epochs, batch_size / num_examples) if private.is_private
             else max(1, round(settings.epochs)) * -(-num_examples // batch_size))
    # Shuffled by the secret seed, as the noise: the sample must not be predictable.
    shuffle_seed = private.seed if private.is_private else settings.seed
    batches = (train.dataset().shuffle(train.shuffle_buffer, seed=shuffle_seed).repeat()
               .batch(batch_size).take(steps))
    if preselection is not None:
      batches = batches.map(lambda x, y: (kept_buckets(x, preselection), y))
    history = _fit_batches(private, batches.prefetch(2), callbacks, verbose)
  elif private.is_private:
    x_train, y_train = train
    x_train = kept_buckets(x_train, preselection)
    if on_ps:
      logs = ParameterServerTraining(private, x_train, y_train).fit(epochs=settings.epochs)
      history = {name: [value] for name, value in logs.items() if name != "keys"}
    else:
      history = _fit_batches(private,
                             private.poisson_dataset(x_train, y_train, epochs=settings.epochs),
                             callbacks, verbose)
  else:
    epochs = max(1, round(settings.epochs))
    history = model.fit(*train, batch_size=batch_size, epochs=epochs, callbacks=callbacks,
                        verbose=verbose).history
    steps = epochs * -(-num_examples // batch_size)
  return steps, history


def _phase(phases: Optional[Phases], name: str):
  """``phases.phase(name)``, or nothing to time."""
  return contextlib.nullcontext() if phases is None else phases.phase(name)


def _auc(labels, logits) -> float:
  auc = keras.metrics.AUC(from_logits=True)
  auc.update_state(labels, logits)
  return float(auc.result())


def held_out_auc(model: keras.Model, held_out, preselection: Optional[Preselection] = None
                 ) -> float:
  """AUC of a trained model (in memory) on another held-out ``(x, y)``, its ids mapped
  through the run's ``preselection`` as the model's own evaluation maps them (a study's
  test split, evaluated beside the validation split the fit reports)."""
  x, y = held_out
  return _auc(y, model.predict(kept_buckets(x, preselection), batch_size=8192, verbose=0))


def kept_buckets(x: dict, preselection: Optional[Preselection]) -> dict:
  """The features ``x`` with their categorical ids mapped to the kept buckets of
  ``preselection`` (DP-FEST's and DP-AdaFEST+'s top-k); ``x`` itself when there is none."""
  if preselection is None:
    return x
  return {**x, "categorical": preselection.apply(x["categorical"])}


def train_and_evaluate(algorithm: str, settings: FitSettings, train, held_out,
                       vocabulary_sizes, fest_k: int = 300, selection_share: float = 0.1,
                       calibration_share: float = 0.0,
                       observers: Optional[Callable[[Optional[Preselection]], Sequence[
                           keras.callbacks.Callback]]] = None,
                       phases: Optional[Phases] = None
                       ) -> tuple[FitResult, Optional[Preselection]]:
  """One configuration of ``sparse-dp train``, trained and evaluated at ``settings.epsilon``
  in all: the command's and the studies' one entry point.

  DP-FEST and DP-AdaFEST+ (Ghazi et al., NeurIPS 2023, §3.1, App. B.1) first spend
  ``epsilon_1 = selection_share * epsilon`` on a private top-``fest_k`` per table
  (:func:`preselect`, keyed by ``settings.noise_seed``) and train on the kept
  buckets at ``epsilon - epsilon_1``; the two compose by basic composition, so the
  metrics' ``epsilon`` is the whole run's. Other algorithms spend all of it training.
  ``observers(preselection)`` returns Keras callbacks that watch every step
  (:func:`fit_and_evaluate`). Returns the fit and the preselection (``None`` when
  the algorithm makes none).

  ``calibration_share`` ``S > 0`` trains at ``(1 - S) epsilon`` and then spends the
  rest on a private Platt scaling fitted on ``train``
  (:mod:`sparse_dp.jobs.train.private_calibration`); the held-out calibration metrics
  are then the calibrated model's, and the ``uncalibrated_*`` ones the model's before.
  ``phases`` times each phase (:class:`~sparse_dp.jobs.job_output.Phases`).
  """
  kind = Algorithm.parse(algorithm)
  job_epsilon = settings.epsilon + settings.earlier_epsilon
  if calibration_share:
    _check_calibrated(kind, train)
    settings = dataclasses.replace(
        settings, epsilon=private_calibration.training_epsilon(settings.epsilon,
                                                               calibration_share))
  preselection = None
  if kind.uses_top_k_selection:
    counted = train if hasattr(train, "num_examples") else train[0]["categorical"]
    preselection = preselect(counted, vocabulary_sizes, fest_k,
                             settings.epsilon * selection_share, settings.noise_seed)
    settings = dataclasses.replace(settings, epsilon=settings.epsilon - preselection.epsilon,
                                   selection_epsilon=preselection.epsilon)
  fit = fit_and_evaluate(algorithm, settings, train, held_out, vocabulary_sizes,
                         preselection=preselection,
                         observers=observers(preselection) if observers else (), phases=phases)
  fit.metrics["selection_epsilon"] = preselection.epsilon if preselection is not None else None
  fit.metrics["calibration_share"] = calibration_share
  if calibration_share:
    with _phase(phases, "private calibration"):
      _calibrate(fit, train, held_out, preselection, job_epsilon, settings.noise_seed)
  if fit.metrics["poisson_sampling"] is False:
    fit.metrics["privacy_caveat"] = NOT_POISSON
  return fit, preselection


def _check_calibrated(kind: Algorithm, train) -> None:
  """Refuses a private calibration the run cannot make."""
  if not kind.is_private:
    raise ValueError("--calibration-share spends a share of a DP run's epsilon: --algorithm "
                     "none has none; drop --calibration-share")
  if not isinstance(train, tuple):
    raise ValueError("--calibration-share fits on the training examples held in memory: use "
                     "--reader pandas, or drop --calibration-share")


def _calibrate(fit: FitResult, train, held_out, preselection: Optional[Preselection],
               job_epsilon: float, noise_seed: Optional[int]) -> None:
  """Folds a private Platt scaling into ``fit.model`` and re-evaluates its calibration."""
  (x_train, y_train), (x_eval, y_eval) = train, held_out
  x_eval = kept_buckets(x_eval, preselection)
  before = {f"uncalibrated_{name}": fit.metrics[name]
            for name in ("logloss", "ece", "mean_predicted")}
  recalibration = private_calibration.recalibrate(
      fit.model, x_train, y_train, job_epsilon, fit.metrics["delta"], noise_seed,
      features=lambda x: kept_buckets(x, preselection))
  calibration, fit.reliability = private_calibration.held_out_metrics(fit.model,
                                                                      (x_eval, y_eval))
  fit.metrics.update(before, **calibration, **recalibration.metrics())


def job_optimizer(name: str, learning_rate: float) -> keras.optimizers.Optimizer:
  """The optimizer ``--optimizer name`` compiles, with step size ``learning_rate``.

  ``adam``, ``adagrad`` and ``sgd`` are Keras's; a DP run trains with their sparse
  forms (:func:`sparse_dp.optimizers.sparse_optimizer`: ``adam`` becomes
  ``LazyAdam``), a non-private run with them as they are. ``lazy-adam`` and
  ``rowwise-adagrad`` are :mod:`sparse_dp.optimizers`' in every run.
  """
  makers = {"adam": keras.optimizers.Adam, "lazy-adam": LazyAdam,
            "adagrad": keras.optimizers.Adagrad, "rowwise-adagrad": RowwiseAdagrad,
            "sgd": keras.optimizers.SGD}
  if name not in makers:
    raise ValueError(f"--optimizer {name!r}: choose from {', '.join(makers)}")
  return makers[name](learning_rate)


def embedding_dims(vocabulary_sizes, settings: FitSettings) -> list[int]:
  """Each table's dimension: ``--embedding-dim``, else the paper's ``int(2 V^0.25)``."""
  return [settings.embedding_dim or embedding_dim(v) for v in vocabulary_sizes]


def check_hardware(settings: FitSettings, algorithms: Sequence[str] = ()) -> None:
  """Refuses, before any data is read, a ``--strategy tpu`` without a TPU, an
  ``--embedding`` the hardware cannot run, and more than one of ``algorithms`` (the private
  models the command trains, in order) for the V1 embedding engine, of which TensorFlow builds
  one per process; joins a ``multi-worker`` cluster before any op runs (the strategies built
  once per process)."""
  if settings.strategy not in ("default", "tpu", "multi-worker"):
    return
  strategy = strategy_named(settings.strategy, settings.tpu)
  embedding_backends.choose_backend(settings.embedding, strategy)
  kinds = [Algorithm.parse(name) for name in algorithms]
  engines = [kind for kind in kinds if kind.is_private and embedding_backends.choose_backend(
      settings.embedding, strategy, kind.noises_every_row).name == "tpu"]
  if len(engines) > 1:
    raise ValueError(f"--strategy tpu trains in the V1 TPU embedding engine, which TensorFlow "
                     f"builds once per process, and this command trains {len(engines)} "
                     f"private models: {ONE_ENGINE_ROUTE}")


def _progress_bar() -> keras.callbacks.ProgbarLogger:
  """Keras's progress bar, showing the epsilon as logged (spent so far), not its mean over
  the epoch's steps as Keras shows a statistic it does not know."""
  return keras.callbacks.ProgbarLogger(count_mode="steps",
                                       stateful_metrics=["epsilon", NOT_POISSON_KEY])


def _fit_batches(private, batches: tf.data.Dataset, callbacks: list, verbose: int) -> dict:
  """Trains on ``batches``; returns the history by statistic.

  Keras ``fit``, or, for tables in the V1 TPU embedding engine
  (``--embedding tpu``), :class:`TPUTrainer`'s loop of two TPU programs per step.
  """
  if private.embedding_choice.name != "tpu":
    return private.model.fit(batches, callbacks=callbacks, verbose=verbose).history
  steps = TPUTrainer(private).fit(batches)
  return {name: [step[name] for step in steps] for name in (steps[0] if steps else {})}


# On preselected tables, DP-FEST is DP-SGD and DP-AdaFEST+ is DP-AdaFEST (App. B).
_TRAINED_AS = {Algorithm.FEST: Algorithm.DPSGD, Algorithm.ADAFEST_PLUS: Algorithm.ADAFEST}


def table_counts(ids, vocabulary_sizes) -> list[tf.Tensor]:
  """Distinct examples per bucket of each table: ``ids[:, t]``, or a stream's."""
  if isinstance(ids, StreamedExamples):
    totals = [tf.zeros([size]) for size in vocabulary_sizes]
    for x, _ in ids.dataset().batch(65_536):
      totals = [total + count for total, count in
                zip(totals, table_counts(x["categorical"].numpy(), vocabulary_sizes))]
    return totals
  return [bucket_counts(tf.constant(ids[:, t]), size) for t, size in enumerate(vocabulary_sizes)]


def preselect(ids, vocabulary_sizes, k: int, epsilon: float,
              noise_seed: Optional[int]) -> Preselection:
  """DP-FEST's private top-``k`` per table over ``ids`` (or a stream), at ``epsilon`` in all."""
  seed = noise_seed if noise_seed is not None else secrets.randbits(62)
  return preselect_buckets(table_counts(ids, vocabulary_sizes), k, epsilon, [seed, 1])


def _dp_config(kind: Algorithm, settings: FitSettings, num_examples: int,
               batch_size: int, vocabulary_sizes: Sequence[int]) -> DPConfig:
  """The run's ``DPConfig``: the noise calibrated here to ``settings.epsilon`` (the
  selection's and earlier runs' epsilon in the budget, not in the target); DP-AdaFEST's
  threshold and noise ratio by the rule of ``adafest_defaults`` where not given, from the
  pCTR tables (``embedding_i`` of ``vocabulary_sizes[i]``) that are not dense."""
  common = dict(l2_norm_clip=settings.l2_norm_clip, contribution_clip=settings.contribution_clip,
                delta=settings.delta, noise_seed=settings.noise_seed)
  if not kind.is_private:
    return DPConfig(kind.value, **common)
  q = batch_size / num_examples
  budget = settings.epsilon + settings.selection_epsilon + settings.earlier_epsilon
  delta = settings.delta if settings.delta is not None else 1.0 / num_examples
  adafest, ratio = None, {}
  if kind.uses_contribution_map:
    tables = named_tables(vocabulary_sizes)
    dense = dense_table_names(settings.dense_tables, kind, tables, batch_size)
    adafest = adafest_settings([size for name, size in tables if name not in dense],
                               batch_size, settings.tau_sigmas, settings.sigma_ratio)
    ratio = {"sigma_ratio": adafest.sigma_ratio}
  spec = calibrate(_TRAINED_AS.get(kind, kind), settings.epsilon, delta,
                   BatchSchedule.constant(q, steps_for_epochs(settings.epochs, q)),
                   **ratio)
  if not kind.uses_contribution_map:
    return DPConfig(kind.value, noise_multiplier=spec.noise_multiplier,
                    selection_epsilon=settings.selection_epsilon,
                    epsilon_budget=budget, **common)
  return DPConfig(kind.value, sigma1=spec.sigma1, sigma2=spec.sigma2,
                  sigma_ratio=adafest.sigma_ratio, threshold=settings.tau,
                  threshold_sigmas=None if settings.tau is not None else adafest.threshold_sigmas,
                  dense_tables=settings.dense_tables, selection_epsilon=settings.selection_epsilon,
                  epsilon_budget=budget, **common)


def _noise_multipliers(private) -> Optional[dict]:
  if not private.is_private:
    return None
  spec = private.spec
  if spec.algorithm.uses_contribution_map:
    return {"sigma1": spec.sigma1, "sigma2": spec.sigma2}
  return {"sigma": spec.noise_multiplier}
