"""The inputs a private run feeds ``fit``: Poisson-sampled datasets made by the run, and the
checks that tell them from any other input (a mixin of ``PrivateTraining``)."""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from sparse_dp.accounting import steps_for_epochs
from sparse_dp.layers import embedding_backends
from sparse_dp.training.poisson.poisson_sampling import (
  PoissonSample,
  batch_capacity,
  derives_from,
  poisson_passes,
  transformations_from,
)


class PoissonInputs:
  """Poisson datasets of one private run; ``PrivateTraining`` sets the attributes read here
  (``sampling_rate``, ``num_examples``, ``max_batch_size``, ``seed``, ``state``, ``model``,
  ``is_private``, ``_poisson_datasets``, ``_streams``)."""

  @property
  def compiled_by_xla(self) -> bool:
    """Whether the model's train step runs compiled by XLA, its asserts compiled away: the
    model is compiled with ``jit_compile=True``, or trains under a ``TPUStrategy`` (a TPU
    compiles every program, whatever ``jit_compile`` says)."""
    return (bool(getattr(self.model, "_jit_compile", False))
            or embedding_backends.on_tpu(self.model.distribute_strategy))

  @property
  def padded_capacity(self) -> int:
    """Rows of this run's padded Poisson batches: exceeded with probability ``<= 1e-18``, a
    multiple of the strategy's replicas (:func:`batch_capacity`)."""
    return batch_capacity(self.num_examples, self.sampling_rate,
                          self.model.distribute_strategy.num_replicas_in_sync)

  def poisson_sample(self, data) -> PoissonSample:
    """The Poisson sampler of ``data``'s rows at this run's rate ``q``.

    Each step's batch is keyed by its step, as
    :class:`~sparse_dp.distribute.ParameterServerTraining` draws it.

    Args:
      data (nest of arrays or tensors): every example, as arrays, ragged or sparse
        tensors.

    Returns:
      A sampler: called with a stateless seed, it returns one Poisson batch of ``data``.
    """
    return PoissonSample(data, self.sampling_rate)

  def poisson_dataset(self, x, y=None, sample_weight=None, epochs: float = 1.0,
                      padded: Optional[bool] = None) -> tf.data.Dataset:
    """Poisson-sampled batches of in-memory ``(x, y, sample_weight)`` for ``epochs``.

    The batches are fresh on every pass (Keras ``epochs=``) and every call. Feed the
    dataset to ``fit`` as it is: ``prefetch``, ``take`` and ``repeat`` are fine. Behind a
    ``map`` or any other transformation its steps count as not Poisson. Transform the
    examples before sampling instead, each from that example alone:
    ``poisson_dataset(f(x), y)`` (manual: *What the epsilon covers*).

    Args:
      x (nest of arrays or tensors): the features of all ``num_examples`` examples: any
        nest of arrays, pandas columns, ragged or sparse tensors.
      y (nest of arrays or tensors): their labels, or ``None``.
      sample_weight (array or tensor): their weights, or ``None``; needs ``y``.
      epochs: expected visits of each example in one pass of the dataset, which has
        ``ceil(epochs / q)`` batches.
      padded: pad every batch to one static size, with its example mask, for steps
        compiled with XLA. Default: when the model is private and its step is compiled by
        XLA (``jit_compile=True``, or a ``TPUStrategy``).

    Returns:
      The batches: ``x``, ``(x, y)`` or ``(x, y, sample_weight)`` each.

    Raises:
      ValueError: the data does not hold exactly ``num_examples`` rows (``q`` and
        ``delta`` are computed from it); ``sample_weight`` comes without ``y``; or
        ``padded=True`` without DP.
    """
    if sample_weight is not None and y is None:
      raise ValueError("poisson_dataset: sample_weight needs labels y (pass y=...); "
                       "a model without labels takes its weights inside x")
    data = tuple(t for t in (x, y, sample_weight) if t is not None)
    stream = (int(self.state.datasets_made.assign_add(1).numpy()) if self.is_private
              else next(self._streams))
    if padded is None:
      padded = self.is_private and self.compiled_by_xla
    if padded and not self.is_private:
      raise ValueError("poisson_dataset(padded=True): algorithm 'none' trains with Keras's own "
                       "train_step, which has no example mask; pass padded=False")
    passes = poisson_passes(data if len(data) > 1 else data[0], self.sampling_rate,
                            steps_for_epochs(epochs, self.sampling_rate), self.seed, stream,
                            num_examples=self.num_examples,
                            capacity=self.padded_capacity if padded else None)
    dataset = passes.dataset()
    self._poisson_datasets[dataset] = passes
    return dataset

  def presampled_dataset(self, dataset: tf.data.Dataset, num_examples: int,
                         sampling_rate: float, max_batch_size: Optional[int]) -> tf.data.Dataset:
    """``dataset``, whose ``fit`` steps count as Poisson: batches sampled before training.

    Only for a sampler that makes each batch an independent Poisson sample of all
    ``num_examples`` examples, truncated to ``max_batch_size``, and feeds each batch at
    most once (:meth:`sparse_dp.jobs.sample.SampledBatches.dataset`).

    Args:
      dataset: the presampled batches.
      num_examples: ``N`` the batches were sampled from.
      sampling_rate: ``q`` they were sampled with.
      max_batch_size: the size they were truncated to; ``None``: not truncated.

    Returns:
      ``dataset`` itself, now recognised by ``fit`` as Poisson batches.

    Raises:
      ValueError: the sample's ``N``, ``q`` or truncation is not the one this run
        accounts.
    """
    sample = (num_examples, sampling_rate, max_batch_size)
    if sample != (self.num_examples, self.sampling_rate, self.max_batch_size):
      raise ValueError(
          f"the batches were sampled with (N, q, max batch size) = {sample}, but this run "
          f"accounts {(self.num_examples, self.sampling_rate, self.max_batch_size)}: pass "
          "make_private the sample's num_examples, batch_size and max_batch_size")
    self._poisson_datasets[dataset] = None
    return dataset

  def transformations_to(self, x) -> Optional[list[str]]:
    """The ``tf.data`` transformations from one of this object's Poisson datasets to ``x``.

    Args:
      x (tf.data.Dataset): the input ``fit`` is given.

    Returns:
      The names of the transformations that do not pass each batch through unchanged,
        in the order applied (``["unbatch", "batch"]``); ``None`` when ``x`` is not built
        on one of these datasets (see :func:`transformations_from`).
    """
    return transformations_from(x, self._live_datasets())

  def feeds_poisson(self, x) -> bool:
    """Whether ``x`` is one of this object's Poisson datasets, behind batch-preserving steps.

    Args:
      x (tf.data.Dataset): the input ``fit`` is given.

    Returns:
      True when ``x`` is such a dataset behind ``prefetch``, ``take``, ``repeat`` or
        options only.
    """
    return derives_from(x, self._live_datasets())

  def next_batch_fingerprint(self, x) -> int:
    """A fingerprint of the first batch ``fit(x)`` will draw.

    Args:
      x (tf.data.Dataset): the input ``fit`` is given.

    Returns:
      The 64-bit fingerprint (:meth:`.PoissonPasses.next_batch_fingerprint`) if ``x`` is
        one of this object's Poisson datasets; else 0.
    """
    for dataset, passes in list(self._poisson_datasets.items()):
      if passes is not None and derives_from(x, [dataset]):
        return passes.next_batch_fingerprint()
    return 0

  def _live_datasets(self) -> list[tf.data.Dataset]:
    return list(self._poisson_datasets)
