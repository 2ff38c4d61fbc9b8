"""A pure-TensorFlow stand-in for the TPU embedding engine, for tests and runs without a TPU.

The engine keeps the tables and their optimizer slots in its own memory and offers two
operations: a **lookup** (an inference enqueue) and a **training round**, which sums the
activation gradients of every id per row, ``g_j = sum_{ids = j} dL/da``, and applies its
optimizer to the rows in the round only (lazy): SGD ``w_j <- w_j - lr g_j``, Adagrad without
epsilon, Adam without bias correction (``w_j <- w_j - lr m_j / sqrt(v_j + eps^2)`` under
``sum_inside_sqrt``). :class:`EngineDouble` is a ``TPUEmbeddingForServing`` (the API's
variables, slots and checkpoint keys) with those two operations added, checked against the
Keras optimizers in ``tests/unit/layers/test_tpu_embedding_engine.py``. What it does not model
(clipping limits, weight decay, non-lazy Adam, FTRL) is refused when it is built. See
docs/tpu.md ("The engine's update rules").
"""

from __future__ import annotations

import tensorflow as tf

from sparse_dp.mechanisms.rows import padding

_API = tf.tpu.experimental.embedding


class EngineDouble(_API.TPUEmbeddingForServing):
  """Tables and slots as the TPU embedding engine holds them, updated by its rules.

  A pure-TensorFlow stand-in for the engine, for tests and runs without a TPU.
  It is a ``TPUEmbeddingForServing`` (the API's variables, slots and checkpoint keys) with the
  engine's two operations added: a lookup and a training round.
  A training round sums the activation gradients of every id per row,
  ``g_j = sum_{ids = j} dL/da``.
  It then applies the optimizer to the rows in the round only (lazy).
  SGD is ``w_j <- w_j - lr g_j``, Adagrad has no epsilon, and Adam has no bias correction.

  Args:
    feature_config: a flat ``{name: FeatureConfig}`` dict of univalent features (dense int ids
      of any shape; one activation per id).
    optimizer (Any): the engine optimizer, ``tf.tpu.experimental.embedding`` ``SGD``,
      ``Adagrad`` or ``Adam`` with ``lazy_adam=True``, with gradient accumulation on and no
      limits.

  Raises:
    ValueError: an optimizer or setting the double does not model: clipping limits, weight
      decay, ``use_gradient_accumulation=False``, non-lazy Adam, or another optimizer (FTRL).
  """

  backend_name = "tpu-engine-double"

  def __init__(self, feature_config: dict, optimizer):
    super().__init__(feature_config, optimizer)
    for table in self._table_config:
      check_modelled(table.optimizer)

  @property
  def checkpointable(self) -> "EngineDouble":
    """What a checkpoint saves of the engine: its tables and slots, as the API's keys."""
    return self

  def slots(self, table_name: str) -> dict:
    """One table's variables, building the engine first if needed.

    Args:
      table_name: the table's name (its layer's).

    Returns:
      ``{"parameters": table, slot name: slot}``, the table and its optimizer slots.
    """
    self._maybe_build()
    return self._variables[table_name]

  def lookup(self, features: dict) -> dict:
    """The engine's forward pass: the rows of each feature's ids (changes nothing).

    The tables are trainable variables of their own (``TPUEmbeddingForServing`` makes them so),
    never a Keras model's.
    A gradient tape watches them, so the DP step differentiates the loss with respect to these
    activations, as it does with the activations the engine dequeues on a TPU.

    Args:
      features: ``{feature name: ids}``.

    Returns:
      ``{feature name: activations}``, one row per id.
    """
    self._maybe_build()
    return {name: tf.gather(self.slots(self._feature_config[name].table.name)["parameters"],
                            tf.cast(ids, tf.int32))
            for name, ids in features.items()}

  def apply_gradients(self, features: dict, gradients: dict) -> tf.Operation:
    """One training round: ``features`` ids with their activation ``gradients``.

    Args:
      features: ``{feature name: ids}``, every feature of the engine, as an enqueue must give
        them.
      gradients: ``{feature name: activation gradients}``, each of its activations' shape.

    Returns:
      The op that updates the rows in the round.

    Raises:
      ValueError: a feature of the engine is missing.
    """
    self._maybe_build()
    missing = sorted(set(self._feature_config) - set(features))
    if missing:
      raise ValueError(f"a training round enqueues every feature; missing {missing}")
    updates = []
    for table in self._table_config:
      names = [n for n, f in self._feature_config.items() if f.table is table]
      ids = tf.concat([tf.reshape(tf.cast(features[n], tf.int32), [-1]) for n in names], 0)
      grads = tf.concat([tf.reshape(gradients[n], [-1, table.dim]) for n in names], 0)
      updates.append(apply_round(table.optimizer, self.slots(table.name), ids, grads))
    return tf.group(updates)


def apply_round(optimizer, variables: dict, rows: tf.Tensor, gradients: tf.Tensor) -> tf.Operation:
  """One table's training round: ``gradients`` (``[n, d]``) summed per row of ``rows``
  (``[n]``, rows of ``variables``), then the optimizer's rule on each row present."""
  # A unique of static shape (XLA compiles it): distinct rows, then padding.
  return _apply_rule(optimizer, variables, *padding.sum_by_row(tf.cast(rows, tf.int64), gradients))


def check_modelled(optimizer) -> None:
  """Refuses engine optimizer settings the double does not reproduce."""
  if not isinstance(optimizer, (_API.SGD, _API.Adagrad, _API.Adam)):
    raise ValueError(f"engine double: optimizer {type(optimizer).__name__} is not modelled; "
                     "use tf.tpu.experimental.embedding.SGD, Adagrad or Adam")
  unmodelled = {"clip_weight_min": optimizer.clip_weight_min,
                "clip_weight_max": optimizer.clip_weight_max,
                "weight_decay_factor": optimizer.weight_decay_factor,
                "clipvalue": optimizer.clip_gradient_min or optimizer.clip_gradient_max}
  given = sorted(name for name, value in unmodelled.items() if value)
  if given or not optimizer.use_gradient_accumulation:
    raise ValueError(f"engine double: {given or 'use_gradient_accumulation=False'} not "
                     "modelled; leave the defaults (gradient accumulation on, no limits)")
  if isinstance(optimizer, _API.Adam) and not optimizer.lazy_adam:
    raise ValueError("engine double: only lazy Adam (lazy_adam=True) is modelled")


def _learning_rate(optimizer) -> tf.Tensor:
  rate = optimizer.learning_rate
  return tf.cast(rate() if callable(rate) else rate, tf.float32)


def _apply_rule(optimizer, variables: dict, rows: tf.Tensor, g: tf.Tensor) -> tf.Operation:
  """The engine optimizer's update of ``rows`` given their accumulated gradients ``g``.

  ``rows`` is a padded row list (distinct rows, then ``PAD``): each variable
  gets ``new - old`` added on the distinct rows and nothing on the padding.
  """
  valid = padding.is_valid(rows)
  rows = padding.safe_rows(rows)
  lr = _learning_rate(optimizer)
  table = variables["parameters"]
  writes = []
  if isinstance(optimizer, _API.SGD):
    step = lr * g
  elif isinstance(optimizer, _API.Adagrad):
    old = tf.gather(variables["accumulators"], rows)
    accumulator = old + tf.square(g)
    step = lr * g * tf.math.rsqrt(accumulator)
    writes.append(_add(variables["accumulators"], rows, valid, accumulator - old))
  else:
    b1, b2, eps = optimizer.beta_1, optimizer.beta_2, optimizer.epsilon
    m_old, v_old = tf.gather(variables["momenta"], rows), tf.gather(variables["velocities"], rows)
    m = b1 * m_old + (1 - b1) * g
    v = b2 * v_old + (1 - b2) * tf.square(g)
    step = lr * m * (tf.math.rsqrt(v + eps * eps) if optimizer.sum_inside_sqrt
                     else 1.0 / (tf.sqrt(v) + eps))
    writes += [_add(variables["momenta"], rows, valid, m - m_old),
               _add(variables["velocities"], rows, valid, v - v_old)]
  writes.append(_add(table, rows, valid, -step))
  return tf.group(writes)


def _add(variable: tf.Variable, rows: tf.Tensor, valid: tf.Tensor, change: tf.Tensor):
  """``variable[rows] += change`` on the valid (distinct) rows; the padding adds zero."""
  return variable.scatter_add(tf.IndexedSlices(padding.mask_rows(change, valid), rows))
