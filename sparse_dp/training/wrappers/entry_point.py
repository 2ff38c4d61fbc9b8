"""``make_private``: the one entry point that makes a compiled Keras model DP."""

from __future__ import annotations

import logging
import math
import types
from typing import Optional, Sequence, Union

import tensorflow as tf

from sparse_dp._keras import keras, require_keras2_model
from sparse_dp.accounting import BatchSchedule, PrivacySpec, Truncation, calibrate, steps_for_epochs
from sparse_dp.distribute import parameter_servers
from sparse_dp.layers import embedding_backends
from sparse_dp.layers.embedding import Embedding
from sparse_dp.mechanisms import false_positive_probability
from sparse_dp.optimizers import sparse_optimizer
from sparse_dp.training.checks import validation
from sparse_dp.training.config import DPConfig, warn_if_threshold_densifies
from sparse_dp.training.dp_state.provenance import fingerprinted_variables, refuse_unbound_weights
from sparse_dp.training.dp_state.state import attach
from sparse_dp.training.dp_state.weight_fingerprint import Fingerprint
from sparse_dp.training.dp_step import dense_layers, mixed_precision, update_guard
from sparse_dp.training.dp_step.input_ids import (
  InputIds,
  functional_input_ids,
  ids_per_example,
  per_example_input_ids,
)
from sparse_dp.training.dp_step.penalties import penalty_of
from sparse_dp.training.dp_step.step import StepNoise
from sparse_dp.training.poisson.poisson_sampling import largest_plausible_batch
from sparse_dp.training.wrappers import fit_wrappers
from sparse_dp.training.wrappers.dp_train_step import dp_train_step
from sparse_dp.training.wrappers.private_training import PrivateTraining, epsilon_budget

_LOG = logging.getLogger(__name__)


def make_private(model: keras.Model, config: DPConfig, *, num_examples: int,
                 batch_size: float, epochs: Optional[float] = None,
                 resume_from: Optional[str] = None, embedding: str = "auto",
                 max_batch_size: Optional[int] = None,
                 public_layers: Sequence[Union[str, keras.layers.Layer]] = (),
                 private_statistics: Sequence = (),
                 input_ids: Optional[InputIds] = None) -> PrivateTraining:
  """Makes ``model.fit`` train with ``config``'s DP algorithm.

  Call it after ``model.compile``, on a built model. It installs a DP ``train_step``,
  private ``fit``, ``train_on_batch`` and ``compile`` wrappers, and an optimizer whose
  table updates stay sparse. The DP state it attaches to the model (``model.dp_state``)
  lasts: a later run on these weights continues the accounting. The manual's guide
  *Making a Keras or TFRS model private* says what it changes and why.

  Example:
    ```python
    private = sparse_dp.make_private(
        model, sparse_dp.DPConfig("adafest", target_epsilon=1.0),
        num_examples=N, batch_size=1024, epochs=3)
    model.fit(private.poisson_dataset(x, y, epochs=3), callbacks=[private.callback()])
    print(private.report().statement())
    ```

  Args:
    model: a compiled, built Keras 2 model: functional, a ``keras.Model`` subclass
      or a ``tfrs.Model``.
    config: the DP algorithm and its clipping norms, noise and budget.
    num_examples: ``N``, the number of training examples (default ``delta = 1 / N``).
    batch_size: the expected batch size ``B``: the noisy sum is divided by it and the
      sampling rate is ``q = B / N``.
    epochs: epochs planned; needed only to calibrate ``config.target_epsilon``.
    resume_from: a TF-format checkpoint prefix, a checkpoint folder or a SavedModel
      folder whose DP state is restored into the model first.
    embedding: where the tables live: ``"auto"`` (by the strategy's hardware),
      ``"tpu"``, ``"cpu"`` or ``"engine-double"`` (off TPU, for tests).
    max_batch_size: batches are Poisson samples truncated to this many examples,
      accounted as such (:class:`sparse_dp.accounting.Truncation`).
    public_layers: preprocessing layers (or their names) whose statistics come from public
      data.
    private_statistics: the :class:`sparse_dp.preprocessing.PrivateStatistic` objects
      of the model's preprocessing layers; their epsilons are spent once, at the start.
    input_ids: ``x -> {table layer name: its ids in the batch's features x}``, for a TPU
      embedding engine, which looks the ids up before the model runs (the SparseCore backend
      here, ``TPUTrainer`` later). It is run on each example alone and must give each table
      the number of ids the layer looks up per example
      (:func:`~sparse_dp.training.dp_step.input_ids.per_example_input_ids`). Default: each
      table's model input, for a functional model that calls every table once directly on
      an input.

  Returns:
    The run's :class:`PrivateTraining`: its accountant, sampler and callback. With
      ``algorithm="none"`` the model trains exactly as plain Keras would.

  Raises:
    ValueError: the model is not compiled or not built, or replaces ``train_step`` or
      ``compute_loss``; ``batch_size`` is not in ``(0, num_examples]``;
      ``target_epsilon`` comes without ``epochs``; ``steps_per_execution`` is not 1
      under an epsilon budget; ``embedding`` does not fit the hardware or the
      algorithm; or ``resume_from`` holds no DP state.
    ModelValidationError: a layer or loss breaks per-example clipping
      (:func:`~sparse_dp.training.checks.validation.check_model`).
    UnsupportedLayerError: a layer with trainable weights is neither ``Dense`` nor
      :class:`sparse_dp.layers.Embedding`.
    UnreachableTargetError: no noise in the searched range meets ``target_epsilon``.
    Keras3ModelError: ``model`` is a Keras 3 model.
  """
  require_keras2_model(model)
  if model.optimizer is None:
    raise ValueError("compile the model (optimizer and loss) before make_private")
  if not 0 < batch_size <= num_examples:
    raise ValueError(f"batch_size must be in (0, num_examples={num_examples}], got {batch_size}")
  algorithm = config.kind
  choice = embedding_backends.choose_backend(embedding, model.distribute_strategy,
                                             algorithm.noises_every_row)
  if not algorithm.is_private:
    if embedding not in ("auto", "cpu"):
      raise ValueError(f"embedding {embedding!r} routes the DP step's update through the TPU "
                       "embedding engine; algorithm 'none' trains as plain Keras: use "
                       "embedding 'cpu'")
    if resume_from is not None:
      raise ValueError("resume_from continues a DP budget; algorithm 'none' has none")
    if choice.name != "cpu":
      choice = embedding_backends.BackendChoice("cpu", "algorithm 'none' trains as plain Keras")
  _refuse_host_tables_on_tpu_cores(model, choice)
  if embedding == "auto":
    _LOG.info("sparse-dp: %s", choice.describe(embedding))
  if not algorithm.is_private:
    training = PrivateTraining(model, config, num_examples, batch_size, spec=None)
    training.embedding_choice = choice
    return training
  _check_built(model)
  _check_train_step(model)
  statistics = {s.layer.name: s for s in private_statistics}
  validation.check_model(model, [*_layer_names(model, public_layers), *statistics])
  fit_wrappers.check_steps_per_execution(model, epsilon_budget(config))
  leaves = dense_layers.trainable_leaf_layers(model)  # fails early on unsupported layers
  penalty = penalty_of(model)  # fails early on a penalty that reaches a table
  table_sizes = [(layer.name, layer.vocabulary_size) for layer in leaves
                 if isinstance(layer, Embedding)]
  dense_tables = config.dense_table_names(table_sizes, batch_size)
  if dense_tables:
    _LOG.info("sparse-dp: noise on every row of %s", ", ".join(sorted(dense_tables)))
  sparse_sizes = [size for name, size in table_sizes if name not in dense_tables]
  config = config.with_adafest_defaults(sparse_sizes, batch_size)
  spec = _resolve_spec(config, num_examples, batch_size, epochs)
  if algorithm.uses_contribution_map:
    warn_if_threshold_densifies(sparse_sizes, config.threshold_for(spec.sigma1),
                                spec.sigma1 * config.contribution_clip, batch_size)
  noise = StepNoise(
      gradient_multiplier=spec.sigma2 if algorithm.uses_contribution_map else spec.noise_multiplier,
      contribution_multiplier=spec.sigma1 if algorithm.uses_contribution_map else None,
      l2_norm_clip=config.l2_norm_clip, contribution_clip=config.contribution_clip,
      threshold=config.threshold_for(spec.sigma1) if algorithm.uses_contribution_map else 0.0,
      expected_batch_size=float(batch_size), dense_tables=dense_tables)
  state = attach(model)
  if not parameter_servers.is_parameter_server(model.distribute_strategy):
    engine = choice.name in ("engine-double", "sparsecore")
    refuse_unbound_weights(model, state.arrived_bindings, Fingerprint(
        fingerprinted_variables(model, [layer for layer in leaves if isinstance(layer, Embedding)]
                                if engine else ()), state.weight_fingerprint))
  if resume_from is not None:
    state.restore(resume_from)
  optimizer, loss_scale = mixed_precision.split_loss_scale(model.optimizer)
  model.optimizer = update_guard.guard(sparse_optimizer(optimizer), model.name)
  if max_batch_size is not None:
    Truncation(num_examples, max_batch_size)  # refuses one the accountant cannot account
  training = PrivateTraining(model, config, num_examples, batch_size, spec, state, leaves,
                             resumed=resume_from is not None, max_batch_size=max_batch_size,
                             statistics_epsilon=sum(s.epsilon for s in statistics.values()))
  training.step_noise = noise
  training.loss_scale = loss_scale
  training.input_ids = input_ids
  model.train_step = types.MethodType(dp_train_step(leaves, noise, penalty, training), model)
  if model.distribute_reduction_method == "auto":
    # The step's logs are the same on every replica (one selection, the run's statistics)
    # or replica 0's (the noise): Keras's "auto" would sum them over the replicas off TPU.
    model.distribute_reduction_method = "first"
  training.embedding_choice = choice
  tables = [layer for layer in leaves if isinstance(layer, Embedding)]
  if choice.name == "engine-double":
    training.use_embedding_backend(embedding_backends.TPUEmbeddingBackend(
        tables, model.optimizer, update_bounds(tables, noise, num_examples, batch_size)))
  elif choice.name == "sparsecore":
    with model.distribute_strategy.scope():
      training.use_embedding_backend(embedding_backends.SparseCoreBackend(
          tables, model.optimizer, update_bounds(tables, noise, num_examples, batch_size),
          {layer: training.largest_batch * ids_per_example(layer) for layer in tables},
          per_example_input_ids(input_ids or functional_input_ids(model, tables), tables)))
  else:
    training.track_weights()
  engine_loop = choice.name == "tpu" or (  # TPUTrainer, V1's loop: host tables are its
      isinstance(training.embedding_backend, embedding_backends.CpuBackend)
      and any(table.table_placement == "host" for table in tables))
  if not engine_loop:
    # A custom loop's step is then traced once, as fit's. The V1 engine's loop keeps its
    # tables' slots (Keras's would double their memory) and makes the others' itself.
    training.create_optimizer_weights()
  fit_wrappers.install(training)
  fit_wrappers.unnest_tpu_step(model)
  model.train_function = None
  return training


def _refuse_host_tables_on_tpu_cores(model: keras.Model,
                                     choice: embedding_backends.BackendChoice) -> None:
  """Refuses host tables (``table_placement='host'``) that TPU programs would read.

  The engines train such tables on a TPU (V1's loop ``TPUTrainer``, V2's step
  reads the engine and copies its rows to the host table when ``fit`` ends);
  with the ``cpu`` backend every step is a TPU program gathering from the table.
  """
  if (choice.name in ("tpu", "sparsecore")
      or not embedding_backends.on_tpu(model.distribute_strategy)):
    return
  on_host = [layer.name for layer in model.submodules
             if isinstance(layer, Embedding) and layer.table_placement == "host"]
  if on_host:
    raise ValueError(
        f"the tables of {', '.join(on_host)} are on the host (table_placement='host'), which "
        f"TPU programs cannot read, and embedding {choice.name!r} trains them in Keras steps "
        "on the TPU cores: build these layers with table_placement='default_device', or, on "
        "a TPU with an embedding engine (V1 or SparseCore), train them there (embedding 'tpu')")


def update_bounds(tables: list, noise: StepNoise, num_examples: int, batch_size: float) -> dict:
  """Per table, the most rows one step selects but with probability ``<= 2e-9``.

  DP-AdaFEST selects the rows a plausible batch looks up (the largest Poisson
  batch but with probability ``1e-9``, times the ids per example of the
  layer's input, or the whole vocabulary for ragged ids) and false positives,
  ``Binomial(V, Psi(tau / (sigma1 C1)))``, bounded the same way (Bernstein).
  DP-SGD updates every row, as DP-AdaFEST does of a dense table.
  """
  if not noise.sparse:
    return {layer: layer.vocabulary_size for layer in tables}
  batches = largest_plausible_batch(num_examples, batch_size / num_examples)
  false_positive = false_positive_probability(
      noise.threshold, noise.contribution_multiplier * noise.contribution_clip)
  bounds = {}
  for layer in tables:
    if layer.name in noise.dense_tables:
      bounds[layer] = layer.vocabulary_size
      continue
    shape = tf.TensorShape(getattr(layer, "_build_input_shape", None))
    per_example = (math.prod(shape[1:]) if shape.rank is not None and shape[1:].is_fully_defined()
                   else layer.vocabulary_size)
    spurious = largest_plausible_batch(layer.vocabulary_size, false_positive)
    bounds[layer] = min(layer.vocabulary_size, batches * per_example + spurious)
  return bounds


def _check_built(model: keras.Model) -> None:
  """Refuses a model whose weights do not exist yet (its leaves cannot be found)."""
  layers = list(model._flatten_layers(include_self=True))
  unbuilt = [layer.name for layer in layers
             if isinstance(layer, (keras.layers.Dense, Embedding)) and not layer.built]
  if unbuilt or not any(layer._trainable_weights for layer in layers):
    raise ValueError(
        f"model '{model.name}' ({type(model).__name__}) is not built"
        f"{' (layers ' + ', '.join(unbuilt) + ')' if unbuilt else ''}: its weights do not "
        "exist yet, so make_private cannot find the layers to clip. Call the model on a "
        "batch first (model(x_batch), or model.compute_loss(batch) for a tfrs.Model) or give "
        "it an Input shape, then call make_private")


def _check_train_step(model: keras.Model) -> None:
  """Refuses a model class with its own ``train_step`` or Keras ``compute_loss``.

  The DP step replaces ``train_step`` and computes the compiled loss per
  example, so either override would be silently dropped. A ``tfrs.Model``'s
  ``compute_loss`` is its per-example loss, which the step uses.
  """
  own = type(model).train_step
  allowed = {keras.Model.train_step}
  try:
    import tensorflow_recommenders as tfrs
    allowed.add(tfrs.Model.train_step)
    tfrs_model = isinstance(model, tfrs.Model)
  except ImportError:
    tfrs_model = False
  if own not in allowed:
    raise ValueError(
        f"{type(model).__name__} defines its own train_step, which make_private would replace "
        "by the DP step, silently dropping what it does; put the per-example loss in "
        "compile(loss=...) (or compute_loss for a tfrs.Model) and keep Keras's train_step")
  keras_compute_loss = getattr(keras.Model, "compute_loss", None)
  if (not tfrs_model and keras_compute_loss is not None
      and type(model).compute_loss is not keras_compute_loss):
    raise ValueError(
        f"{type(model).__name__} overrides keras.Model.compute_loss, which the DP step does "
        "not call: it applies the compiled loss to each example alone, so the override "
        "would be silently dropped. Put the loss in compile(loss=...) as a per-example "
        "keras.losses.Loss (reduction NONE), or make the model a tfrs.Model whose "
        "compute_loss(features) returns one loss per example")


def _layer_names(model: keras.Model, layers) -> list[str]:
  """``public_layers`` as layer names, each naming one layer of ``model`` alone (a layer
  stands for its ``name``): the preprocessing check matches by name, so a name two layers
  share, or a layer the model does not hold, could declare another layer public."""
  if isinstance(layers, (str, keras.layers.Layer)):
    raise TypeError(f"public_layers takes a list of layers or names, got {layers!r}: pass "
                    "[it]")
  held = list(model._flatten_layers(include_self=True))
  names = []
  for layer in layers:
    if not isinstance(layer, (str, keras.layers.Layer)):
      raise TypeError(f"public_layers takes layers or their names, got {layer!r}")
    name = layer if isinstance(layer, str) else layer.name
    if not isinstance(layer, str) and not any(other is layer for other in held):
      raise ValueError(f"public_layers holds layer '{name}', which model '{model.name}' does "
                       "not: declare the model's own layer")
    if sum(other.name == name for other in held) > 1:
      raise ValueError(f"public_layers declares '{name}', the name of more than one layer of "
                       f"model '{model.name}': give its preprocessing layers distinct names")
    names.append(name)
  return names


def _resolve_spec(config: DPConfig, num_examples, batch_size, epochs) -> PrivacySpec:
  algorithm = config.kind
  q = batch_size / num_examples
  if config.target_epsilon is None:
    return PrivacySpec(algorithm, BatchSchedule.constant(q, 0),
                       noise_multiplier=(None if algorithm.uses_contribution_map
                                         else config.noise_multiplier),
                       sigma1=config.sigma1 if algorithm.uses_contribution_map else None,
                       sigma2=config.sigma2 if algorithm.uses_contribution_map else None,
                       selection_epsilon=config.selection_epsilon)
  if epochs is None:
    raise ValueError("target_epsilon needs epochs= to know how many steps to calibrate for")
  delta = config.delta if config.delta is not None else 1.0 / num_examples
  return calibrate(algorithm, config.target_epsilon, delta,
                   BatchSchedule.constant(q, steps_for_epochs(epochs, q)),
                   sigma_ratio=config.sigma_ratio, selection_epsilon=config.selection_epsilon)
