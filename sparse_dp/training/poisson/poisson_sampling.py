"""Poisson sampling of batches from in-memory data (Ghazi et al., NeurIPS 2023, §3.3).

The accountant assumes every example joins every batch independently with probability ``q``.
``poisson_batches`` does exactly that: the batch of step ``t`` of pass ``p`` holds the examples
at the positions :func:`bernoulli_positions` draws from ``[0, N)`` with seed
``fold_in(fold_in(fold_in(seed, stream), p), t)``, so batch sizes vary around ``q N`` and the
work per batch is O(batch), not O(N). ``p`` counts the passes begun over the dataset
(:class:`PoissonPasses`) and ``stream`` numbers the datasets made from one secret seed, so no
pass replays another's batches. The batches depend on nothing else (not on TensorFlow's
global seed): workers of one multi-worker job draw the same global batches, which ``fit``
checks (:func:`sparse_dp.distribute.workers.refuse_different_batches`). ``data`` is any nest
of arrays, tensors, ragged and sparse tensors; with a ``capacity`` every batch is padded
(:mod:`sparse_dp.training.poisson.padded_batches`). See docs/epsilon.md ("The sample").
"""

from __future__ import annotations

import math
import re
from typing import Optional

import numpy as np
import tensorflow as tf

from sparse_dp.distribute import workers
from sparse_dp.mechanisms import bernoulli_positions
from sparse_dp.training.poisson import padded_batches

_SAMPLE_SALT = 0x5DEECE66D


def poisson_batches(data, sampling_rate: float, steps: int, seed: int = 0,
                    stream: int = 0, num_examples: Optional[int] = None,
                    capacity: Optional[int] = None) -> tf.data.Dataset:
  """``steps`` Poisson-sampled batches of ``data`` per pass, fresh on every pass.

  Each example joins each batch independently with probability ``q`` (Ghazi et al.,
  NeurIPS 2023, §3.3), so batch sizes vary around ``q N``. This is the dataset of
  :func:`poisson_passes`, which takes the same arguments.

  Args:
    data (nest of arrays or tensors): the examples: a nest of arrays, tensors, pandas
      columns, ``tf.RaggedTensor`` and ``tf.SparseTensor`` sharing their first dimension.
    sampling_rate: ``q``, in ``(0, 1]``.
    steps: batches per pass, an integer ``>= 1``.
    seed: the secret seed that keys the sample, with ``stream``.
    stream: a number distinct for every dataset made from one seed. A fixed
      ``(seed, stream)`` makes the sequence of passes reproducible.
    num_examples: the ``N`` the accounting was declared for; ``data`` with another
      number of rows is refused.
    capacity: pad every batch to this many rows, with its example mask, for steps
      compiled with XLA.

  Returns:
    The batches, ``steps`` per pass; a pass is every iteration of the dataset.

  Raises:
    ValueError: ``sampling_rate`` is not in ``(0, 1]``, ``steps`` is not an integer
      ``>= 1``, or ``data``'s rows are not ``num_examples`` or differ between arrays.
  """
  return poisson_passes(data, sampling_rate, steps, seed, stream, num_examples,
                        capacity).dataset()


def poisson_passes(data, sampling_rate: float, steps: int, seed: int = 0,
                   stream: int = 0, num_examples: Optional[int] = None,
                   capacity: Optional[int] = None) -> PoissonPasses:
  """The :class:`PoissonPasses` of ``steps`` Poisson-sampled batches of ``data`` per pass.

  ``seed`` (secret) and ``stream`` (distinct for every dataset made from one
  seed) key the sample; a fixed pair makes the sequence of passes reproducible.
  ``num_examples``: the ``N`` the accounting was declared for
  (``make_private``'s): ``q`` and the default ``delta = 1 / N`` hold only for a
  sample of exactly ``N`` examples, so ``data`` with another number of rows is
  refused. ``capacity``: pad every batch to that many rows, with its example
  mask (:class:`PoissonSample`).
  """
  if not 0 < sampling_rate <= 1:
    raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
  if not isinstance(steps, (int, np.integer)) or steps < 1:
    raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
  data = tf.nest.map_structure(_as_tensor, data)
  rows = num_rows(data)
  if num_examples is not None and rows != num_examples:
    raise ValueError(
        f"poisson_dataset: the data has {rows:,} rows (examples) but make_private was told "
        f"num_examples={num_examples:,}; the sampling rate q = batch_size / num_examples and "
        "the default delta = 1 / num_examples hold only for a sample of all num_examples "
        f"examples. Pass make_private num_examples={rows}, or give poisson_dataset all "
        f"{num_examples:,} examples")
  return PoissonPasses(PoissonSample(data, sampling_rate, capacity), steps, seed, stream)


class PoissonPasses:
  """``steps`` batches of a :class:`PoissonSample` per pass, keyed by an explicit pass count.

  Pass ``p`` (the ``p``-th iteration of :meth:`dataset`, counted from 0) has
  the batches ``sample(fold_in(fold_in(fold_in([seed, salt], stream), p), t))``
  for ``t < steps``. The count ``passes`` is a variable of this process's CPU
  that each pass increments as it begins.
  """

  def __init__(self, sample: PoissonSample, steps: int, seed: int, stream: int):
    self.sample = sample
    self.steps = steps
    self._base = tf.random.experimental.stateless_fold_in(
        tf.constant([seed, _SAMPLE_SALT], tf.int64), stream)
    self.passes = workers.host_variable(0, dtype=tf.int64, trainable=False,
                                        name="poisson_passes")

  def dataset(self) -> tf.data.Dataset:
    """The batches of one new pass per iteration (each split exactly among the replicas of a
    multi-worker ``fit``: :func:`~sparse_dp.distribute.workers.sliced_per_replica`)."""
    return workers.sliced_per_replica(tf.data.Dataset.range(1).flat_map(self._next_pass)
                                      .apply(tf.data.experimental.assert_cardinality(self.steps)))

  def batch(self, pass_index, step) -> tf.Tensor:
    """The batch of ``step`` in pass ``pass_index``."""
    pass_seed = tf.random.experimental.stateless_fold_in(self._base, pass_index)
    return self.sample(tf.random.experimental.stateless_fold_in(pass_seed, step))

  def next_batch_fingerprint(self) -> int:
    """A 64-bit fingerprint of the first batch of the pass that begins next (none begins)."""
    parts = tf.nest.flatten(self.batch(self.passes.read_value(), 0), expand_composites=True)
    each = tf.fingerprint(tf.stack([tf.io.serialize_tensor(part) for part in parts]))
    whole = tf.fingerprint(tf.reshape(each, [1, -1]))[0]
    return int(tf.bitcast(whole, tf.int64).numpy())

  def _next_pass(self, _):
    pass_index = self.passes.assign_add(1) - 1
    return tf.data.Dataset.range(self.steps).map(lambda step: self.batch(pass_index, step))


class PoissonSample:
  """One Poisson batch of in-memory ``data``: each row independently with probability ``q``.

  With a ``capacity``, the batch is padded to ``capacity`` rows with copies of
  the first example and comes with its mask (:func:`padded_batches.padded`);
  a sample larger than ``capacity`` is refused (an ``InvalidArgumentError``
  from the input pipeline, which is never compiled), not cut.
  """

  def __init__(self, data, sampling_rate: float, capacity: Optional[int] = None):
    self.data = tf.nest.map_structure(_as_tensor, data)
    self.rows = num_rows(self.data)
    self.sampling_rate = sampling_rate
    self.capacity = capacity
    self._sparse_rows = tf.nest.map_structure(_sparse_row_index, self.data)

  def __call__(self, seed, part=0, parts: int = 1):
    """The batch keyed by ``seed`` (a stateless seed, shape ``[2]``), or one part of it.

    With ``parts > 1``: the ``part``-th (an int or a scalar tensor, from 0) of
    ``parts`` contiguous, disjoint slices of the sampled examples, of sizes
    differing by at most one, whose union is the batch: every replica of a
    step draws the same sample (the seed is stateless) and takes its own part.
    """
    positions = (tf.range(self.rows, dtype=tf.int64) if self.sampling_rate == 1
                 else bernoulli_positions(self.rows, self.sampling_rate, seed))
    if parts > 1:
      sampled = tf.size(positions, out_type=tf.int64)
      part = tf.cast(part, tf.int64)
      positions = positions[sampled * part // parts:sampled * (part + 1) // parts]
    if self.capacity is None:
      return self._gather(positions)
    size = tf.size(positions, out_type=tf.int64)
    fits = tf.debugging.assert_less_equal(
        size, tf.constant(self.capacity, tf.int64), message=(
            f"sparse-dp: this Poisson batch is larger than the padded batch capacity "
            f"{self.capacity:,} (an event of probability <= {CAPACITY_OVERFLOW:g} per step); "
            "it is refused rather than cut. Re-run with another noise_seed"))
    with tf.control_dependencies([fits]):
      filler = tf.zeros([self.capacity], tf.int64)  # the first example, masked out
      positions = tf.ensure_shape(tf.concat([positions, filler], 0)[:self.capacity],
                                  [self.capacity])
    in_batch = tf.range(self.capacity, dtype=tf.int64) < size
    return padded_batches.padded(self._gather(positions), in_batch)

  def _gather(self, positions):
    return tf.nest.map_structure(lambda t, rows: _gather_rows(t, rows, positions),
                                 self.data, self._sparse_rows)


def gather_examples(data, positions: tf.Tensor):
  """The examples at ``positions`` of a nest of dense, ragged or (row-ordered) sparse tensors."""
  data = tf.nest.map_structure(_as_tensor, data)
  return tf.nest.map_structure(
      lambda t: _gather_rows(t, _sparse_row_index(t), positions), data)


def examples_in_batch(data):
  """The sampled examples of a padded batch (host side: a dynamic size); others as they are."""
  batch, in_batch = padded_batches.split(data)
  if in_batch is None:
    return data
  return gather_examples(batch, tf.where(in_batch)[:, 0])


def num_rows(data) -> int:
  """The common first dimension of a nest of tensors, with a clear error otherwise."""
  sizes = {_rows(t) for t in tf.nest.flatten(data)}
  if len(sizes) != 1:
    raise ValueError(f"every array of the training data needs the same number of rows "
                     f"(examples), got {sorted(sizes)}")
  return sizes.pop()


def _as_tensor(value):
  if isinstance(value, (tf.RaggedTensor, tf.SparseTensor)):
    return tf.sparse.reorder(value) if isinstance(value, tf.SparseTensor) else value
  if hasattr(value, "to_numpy"):  # a pandas Series or DataFrame
    value = value.to_numpy()
  return tf.convert_to_tensor(value)


def _rows(tensor) -> int:
  if isinstance(tensor, tf.RaggedTensor):
    return int(tensor.nrows())
  if isinstance(tensor, tf.SparseTensor):
    return int(tensor.dense_shape[0])
  if tensor.shape.rank == 0:
    raise ValueError("training data must have one row per example; got a scalar")
  return int(tensor.shape[0])


def _sparse_row_index(tensor):
  """For a ``SparseTensor``: its entries grouped by row (a ragged ``[N, None]``)."""
  if not isinstance(tensor, tf.SparseTensor):
    return None
  entries = tf.range(tf.shape(tensor.indices, out_type=tf.int64)[0])
  return tf.RaggedTensor.from_value_rowids(entries, tensor.indices[:, 0],
                                           nrows=tensor.dense_shape[0])


def _gather_rows(tensor, sparse_rows, positions):
  """Rows ``positions`` of a dense, ragged or (row-ordered) sparse tensor."""
  if not isinstance(tensor, tf.SparseTensor):
    return tf.gather(tensor, positions)
  picked = tf.gather(sparse_rows, positions)
  entries = picked.flat_values
  new_rows = picked.value_rowids()[:, None]
  indices = tf.concat([new_rows, tf.gather(tensor.indices[:, 1:], entries)], axis=1)
  shape = tf.concat([tf.size(positions, out_type=tf.int64)[None], tensor.dense_shape[1:]], 0)
  return tf.SparseTensor(indices, tf.gather(tensor.values, entries), shape)


# Transformations that pass each element of their input through unchanged: a
# Poisson batch behind them is still that Poisson batch. Anything else (map,
# unbatch, rebatch, filter, cache, shuffle, zip, ...) is not: a ``map`` over a
# batch can copy one example into several rows or mix examples, so it is not
# known to keep each example's influence in its own row (the clipping bound).
_BATCH_PRESERVING = frozenset({"_PrefetchDataset", "_TakeDataset", "_RepeatDataset",
                               "_OptionsDataset"})
# A step tf.data inserts inside others (unbatch's), not one a user writes.
_INTERNAL = frozenset({"_RestructuredDataset"})


def transformations_from(dataset, sources) -> Optional[list[str]]:
  """What ``dataset`` does to the batches of one of ``sources``, if built on one.

  ``None`` when ``dataset`` is not built on any of ``sources``; else the
  transformations that do not pass each batch through unchanged, in the order
  applied, named as in ``tf.data`` (``["unbatch", "batch"]``), for messages;
  :func:`derives_from` decides.
  """
  path = _path_from(dataset, sources)
  if path is None:
    return None
  names = [re.sub(r"(?<!^)(?=[A-Z])", "_", name.strip("_").removesuffix("Dataset")).lower()
           for name in reversed(path)
           if name not in _BATCH_PRESERVING and name not in _INTERNAL]
  return list(dict.fromkeys(names))


def derives_from(dataset, sources) -> bool:
  """Whether ``dataset`` is in ``sources`` behind ``prefetch``/``take``/``repeat``/options only."""
  path = _path_from(dataset, sources)
  return path is not None and set(path) <= _BATCH_PRESERVING


def _path_from(dataset, sources) -> Optional[list[str]]:
  """``tf.data`` class names from ``dataset`` (first) down to one of ``sources``."""
  if not isinstance(dataset, tf.data.Dataset):
    return None
  if any(dataset is source for source in sources):
    return []
  for parent in dataset._inputs():
    below = _path_from(parent, sources)
    if below is not None:
      return [type(dataset).__name__] + below
  return None


# Probability that a Poisson sample exceeds :func:`largest_plausible_batch`.
BATCH_SIZE_FALSE_ALARM = 1e-9
# Probability that a Poisson batch exceeds batch_capacity (and is refused).
CAPACITY_OVERFLOW = 1e-18


def largest_plausible_batch(num_examples: int, sampling_rate: float,
                            false_alarm: float = BATCH_SIZE_FALSE_ALARM) -> int:
  """A size that a Poisson batch of rate ``q`` exceeds with probability ``<= false_alarm``.

  The batch size is ``X ~ Binomial(N, q)`` with mean ``mu = q N`` and variance
  ``v = q (1 - q) N``; Bernstein's inequality (terms bounded by 1) gives
  ``P(X >= mu + t) <= exp(-t^2 / (2 (v + t / 3)))``, which equals ``alpha``
  at ``t = a / 3 + sqrt(a^2 / 9 + 2 a v)`` with ``a = ln(1 / alpha)``. At
  ``alpha = 1e-9`` and ``mu = 20`` the bound is 56; at ``mu = 1024``, 1,236.
  A batch larger than this is not a draw of the rate the accountant charges
  (the real rate is larger, and so is the real epsilon), while a correct run
  fails this way about once in a billion steps.
  """
  mean = num_examples * sampling_rate
  variance = mean * (1 - sampling_rate)
  a = math.log(1 / false_alarm)
  deviation = a / 3 + math.sqrt(a * a / 9 + 2 * a * variance)
  return min(int(num_examples), math.floor(mean + deviation))


def batch_capacity(num_examples: int, sampling_rate: float, replicas: int = 1) -> int:
  """Rows of a padded batch: exceeded by a Poisson batch with probability ``<= 1e-18``.

  :func:`largest_plausible_batch` at ``alpha = CAPACITY_OVERFLOW``: at
  ``q N = 1,024`` it is 1,329 (30% padding); at ``q N = 20``, 76. Rounded up to a multiple
  of ``replicas``, so that a distributed batch gives every replica one static shape (1,336
  rows, 167 a replica, on 8): a TPU compiles one program for all of them.

  Args:
    num_examples: ``N``.
    sampling_rate: ``q``.
    replicas: the replicas a batch is split among (``num_replicas_in_sync``).

  Returns:
    The capacity, a multiple of ``replicas``.
  """
  capacity = largest_plausible_batch(num_examples, sampling_rate, CAPACITY_OVERFLOW)
  return -(-capacity // replicas) * replicas


def head(data, rows: int):
  """The first ``rows`` examples of a nest of arrays, pandas columns, ragged or sparse tensors."""
  def first(value):
    if isinstance(value, tf.SparseTensor):
      return tf.sparse.slice(value, tf.zeros_like(value.dense_shape),
                             tf.concat([tf.constant([rows], tf.int64), value.dense_shape[1:]], 0))
    if hasattr(value, "iloc"):  # pandas
      return value.iloc[:rows].to_numpy()
    return value[:rows]
  return tf.nest.map_structure(first, data)
