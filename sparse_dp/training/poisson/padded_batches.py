"""Poisson batches of one static size, with an example mask, for compiled steps.

A Poisson batch has ``X ~ Binomial(N, q)`` examples, a size known only when it
is drawn. XLA (``model.compile(jit_compile=True)``, every program on a TPU)
compiles a program for each input shape it sees, so a compiled DP step fed
Poisson batches as they are compiles anew for almost every step. A padded
batch has instead ``capacity`` rows: the sampled examples, then copies of the
data's first example, with ``in_batch[i]`` true on the sampled rows only. The
DP step (:mod:`sparse_dp.training.dp_step.per_example`) gives every row where
``in_batch`` is false the loss 0, no lookups and a zero gradient, with
``tf.where`` (never a multiplication, which a non-finite value would survive):
the clipped sums, the contribution map and the logged loss are exactly those of
the sampled examples, so the step releases the same update as on the unpadded
batch, which the tests check for every algorithm.

The capacity is :func:`sparse_dp.training.poisson.poisson_sampling.batch_capacity`, a size a
Poisson batch of rate ``q`` exceeds with probability at most
:data:`~sparse_dp.training.poisson.poisson_sampling.CAPACITY_OVERFLOW` (``1e-18``). A
batch larger than it is refused in the input pipeline, which runs on the host
and is never compiled, so the refusal holds under XLA; nothing is dropped. The
refusal is an event of probability ``<= 1e-18`` per step under any data set, so
the run it stops differs from the accounted mechanism by at most ``T 1e-18`` in
total variation over ``T`` steps, which moves ``delta`` by less than ``1e-11``
for a million steps at ``epsilon <= 10``.

On the wire, a padded batch is the dict ``{EXAMPLES: batch, IN_BATCH: mask}``
(:func:`padded`); :func:`split` takes it apart in the step.
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
