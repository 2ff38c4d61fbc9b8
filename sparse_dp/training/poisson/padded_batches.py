"""Poisson batches of one static size, with an example mask, for compiled steps.

A Poisson batch has ``X ~ Binomial(N, q)`` examples, and XLA compiles a program for each input
shape it sees. A padded batch has instead ``capacity`` rows: the sampled examples, then copies
of the data's first example, with ``in_batch[i]`` true on the sampled rows only. The DP step
(:mod:`sparse_dp.training.dp_step.per_example`) gives every other row the loss 0, no lookups
and a zero gradient (``tf.where``), so it releases the same update as on the unpadded batch.
The capacity is :func:`sparse_dp.training.poisson.poisson_sampling.batch_capacity`, exceeded
with probability at most ``CAPACITY_OVERFLOW`` (``1e-18``); a larger batch is refused in the
input pipeline, on the host, which moves ``delta`` by at most ``T 1e-18`` over ``T`` steps.
On the wire a padded batch is ``{EXAMPLES: batch, IN_BATCH: mask}`` (:func:`padded`);
:func:`split` takes it apart in the step. See docs/tpu.md ("Compiled with XLA").
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

EXAMPLES = "sparse_dp_examples"
IN_BATCH = "sparse_dp_in_batch"


def padded(batch, in_batch: tf.Tensor) -> dict:
  """The padded batch of ``batch`` (``capacity`` rows) and its mask ``in_batch [capacity]``."""
  return {EXAMPLES: batch, IN_BATCH: in_batch}


def is_padded(data) -> bool:
  """Whether ``data`` (a batch, or a dataset's ``element_spec``) is a padded batch."""
  return isinstance(data, dict) and set(data) == {EXAMPLES, IN_BATCH}


def split(data) -> tuple[object, Optional[tf.Tensor]]:
  """``(batch, in_batch)`` of a padded batch; ``(data, None)`` of any other batch."""
  if is_padded(data):
    return data[EXAMPLES], tf.convert_to_tensor(data[IN_BATCH], tf.bool)
  return data, None
