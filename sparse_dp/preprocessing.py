"""Preprocessing layers whose statistics of the private data are DP, with their epsilon.

An adapted ``Normalization``, ``Discretization`` or ``IntegerLookup`` holds exact statistics
of the training data, which ``make_private`` refuses. These functions compute them with pure
``epsilon``-DP mechanisms (add/remove adjacency, ``N`` public) and return the layer with its
epsilon, a :class:`PrivateStatistic` for ``make_private(..., private_statistics=[...])``:

* :func:`private_mean_variance`: values clipped to ``[low, high]``, Laplace noise of scale
  ``F Delta / (epsilon / 2)`` on the sums of values and of squares (Dwork et al., TCC 2006);
* :func:`private_quantiles`: per quantile ``p``, the exponential mechanism over a public grid
  with utility ``-|#{x <= c} - p N|``, at ``epsilon / m`` each (Smith, STOC 2011);
* :func:`private_vocabulary`: DP-FEST's Gumbel top-k of the ids' example counts.

The noise comes from the OS's entropy unless ``seed`` is given. See docs/epsilon.md ("The
sample").
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Optional, Sequence

import numpy as np
import tensorflow as tf

from sparse_dp._keras import keras
from sparse_dp.accounting.algorithms import check_positive
from sparse_dp.mechanisms import bucket_counts, dp_top_k


@dataclasses.dataclass(frozen=True)
class PrivateStatistic:
  """A preprocessing layer whose statistics are ``epsilon``-DP (pure).

  Pass it to ``make_private(..., private_statistics=[...])``.

  Attributes:
    layer: the Keras preprocessing layer, holding the DP statistics.
    epsilon: the statistics' privacy cost (pure DP, add/remove adjacency).
    mechanism: the mechanism's name, as the reports print it.
  """

  layer: keras.layers.Layer
  epsilon: float
  mechanism: str


def _rng(seed: Optional[int]) -> np.random.Generator:
  return np.random.default_rng(secrets.randbits(128) if seed is None else seed)


def private_mean_variance(values, low: float, high: float, epsilon: float,
                          seed: Optional[int] = None, name: Optional[str] = None
                          ) -> PrivateStatistic:
  """A ``Normalization`` layer with the DP mean and variance of ``values``.

  The values are clipped to ``[low, high]``.
  Laplace noise of scale ``F Delta / (epsilon / 2)`` is added to the sums of the values, with
  ``Delta = max(|low|, |high|)`` (Dwork et al., TCC 2006).
  Laplace noise of scale ``F Delta^2 / (epsilon / 2)`` is added to the sums of their squares.
  The number of examples ``N`` is public.
  The mean is clipped to ``[low, high]``, and the variance is at least ``1e-12``.

  Args:
    values (array-like): ``[N, F]`` (or ``[N]``) values of ``F`` features.
    low: the clipping range's lower end.
    high: the clipping range's upper end, above ``low``.
    epsilon: the privacy cost, half on the sums and half on the sums of squares.
    seed: the noise's seed; ``None``, the default, takes it from the OS's entropy.
    name: the layer's name.

  Returns:
    The layer with its ``epsilon``.

  Raises:
    ValueError: ``epsilon`` is not a finite number > 0, or ``low >= high``.
  """
  check_positive("epsilon", epsilon)
  if not low < high:
    raise ValueError(f"private_mean_variance needs low < high, got [{low}, {high}]")
  values = np.clip(np.asarray(values, np.float64).reshape(len(values), -1), low, high)
  count, features = values.shape
  rng = _rng(seed)
  bound = max(abs(low), abs(high))
  half = epsilon / 2
  total = values.sum(0) + rng.laplace(0.0, features * bound / half, features)
  squares = (np.square(values).sum(0)
             + rng.laplace(0.0, features * bound * bound / half, features))
  mean = np.clip(total / count, low, high)
  variance = np.maximum(squares / count - np.square(mean), 1e-12)
  layer = keras.layers.Normalization(mean=mean, variance=variance, name=name)
  return PrivateStatistic(layer, float(epsilon), "laplace mean and variance")


def private_quantiles(values, quantiles: Sequence[float], candidates, epsilon: float,
                      seed: Optional[int] = None, name: Optional[str] = None
                      ) -> PrivateStatistic:
  """A ``Discretization`` layer whose boundaries are DP ``quantiles`` of ``values``.

  Each quantile ``p`` is chosen by the exponential mechanism over a public grid, at
  ``epsilon / m`` for ``m`` quantiles (Smith, STOC 2011).
  Its utility is ``-|#{x <= c} - p N|``.
  Equal boundaries are merged.

  Args:
    values (array-like): ``[N]`` values of one feature.
    quantiles: the quantiles ``p`` to release, each in ``(0, 1)``.
    candidates (array-like): a public grid the boundaries are chosen from.
    epsilon: the privacy cost of all the quantiles together.
    seed: the noise's seed; ``None``, the default, takes it from the OS's entropy.
    name: the layer's name.

  Returns:
    The layer with its ``epsilon``.

  Raises:
    ValueError: ``epsilon`` is not a finite number > 0, or ``quantiles`` is empty or has one
      outside ``(0, 1)``.
  """
  check_positive("epsilon", epsilon)
  values = np.asarray(values, np.float64).reshape(-1)
  grid = np.unique(np.asarray(candidates, np.float64))
  if not quantiles or any(not 0 < p < 1 for p in quantiles):
    raise ValueError(f"quantiles must be in (0, 1), got {quantiles}")
  rng = _rng(seed)
  picked = [grid[np.argmax(quantile_scores(values, p, grid, epsilon / len(quantiles))
                           + rng.gumbel(size=grid.size))] for p in quantiles]
  layer = keras.layers.Discretization(bin_boundaries=sorted(set(float(b) for b in picked)),
                                      name=name)
  return PrivateStatistic(layer, float(epsilon), "exponential-mechanism quantiles")


def quantile_scores(values: np.ndarray, p: float, grid: np.ndarray, epsilon: float) -> np.ndarray:
  """The log-weights ``epsilon u(c) / 2`` of the exponential mechanism for quantile ``p``.

  The utility is ``u(c) = -|#{x <= c} - pN|``.
  Sampling ``argmax(scores + Gumbel)`` picks ``c`` with probability
  ``exp(scores[c]) / sum exp(scores)``.
  That is ``epsilon``-DP, as ``u`` moves by at most 1 when one value is added or removed.

  Args:
    values: ``[N]``, the private values.
    p: the quantile, in ``(0, 1)``.
    grid: the candidates ``c``.
    epsilon: the privacy cost of this quantile.

  Returns:
    One score per candidate of ``grid``.
  """
  below = np.searchsorted(np.sort(values), grid, side="right")
  return -epsilon * np.abs(below - p * values.size) / 2


def private_vocabulary(ids, id_range: int, k: int, epsilon: float, seed: Optional[int] = None,
                       name: Optional[str] = None) -> PrivateStatistic:
  """An ``IntegerLookup`` of ``k`` ids of ``[0, id_range)`` chosen by DP top-k of ``ids``.

  It is DP-FEST's Gumbel top-k of the ids' example counts (:func:`sparse_dp.mechanisms.dp_top_k`).

  Args:
    ids (array-like | tf.RaggedTensor | tf.SparseTensor): each example's ids, ``[N]``,
      ``[N, L]``, ragged or sparse. An example counts once per distinct id.
    id_range: the ids' range ``[0, id_range)``.
    k: the number of ids to keep.
    epsilon: the privacy cost.
    seed: the noise's seed; ``None``, the default, takes it from the OS's entropy.
    name: the layer's name.

  Returns:
    The layer with its ``epsilon``.

  Raises:
    ValueError: ``epsilon`` is not a finite number > 0, or ``k`` is not an integer in
      ``[1, id_range]``.
    tf.errors.InvalidArgumentError: an id outside ``[0, id_range)``.
  """
  ids = ids if isinstance(ids, (tf.RaggedTensor, tf.SparseTensor)) else tf.constant(ids, tf.int64)
  counts = bucket_counts(ids, id_range)
  draw = secrets.randbits(62) if seed is None else seed
  chosen = dp_top_k(counts, k, epsilon, tf.constant([draw, 0x70CAB], tf.int64))
  layer = keras.layers.IntegerLookup(vocabulary=chosen.numpy(), name=name)
  return PrivateStatistic(layer, float(epsilon), "gumbel top-k vocabulary")
