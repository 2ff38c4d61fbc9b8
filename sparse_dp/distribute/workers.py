"""What every worker of a multi-worker strategy must agree on before the first step.

Under ``tf.distribute.MultiWorkerMirroredStrategy`` each worker calls ``make_private`` itself,
and the DP step derives step ``t``'s selection and noise from one secret seed (Ghazi et al.,
NeurIPS 2023, Algorithm 1, lines 6-8 and 11). Every worker must hold the *same* seed, or the
replicas would mask their examples to different selections and the all-reduced sum would carry
un-noised gradients; a seed drawn from the OS on each worker is therefore replaced by worker
0's, gathered over the strategy's collectives. Each worker then draws the whole global Poisson
batch of a step and trains on its slice: ``fit`` compares a fingerprint of the first batch
across the workers (:func:`refuse_different_batches`) and checks that each batch is split
exactly among the replicas (:func:`sliced_per_replica`, :func:`refuse_unsliced_batches`).
Training on the batches of ``sparse-dp sample`` takes the chief's first step
(:func:`chiefs_value`) instead of a pass key. See docs/clusters.md.
"""

from __future__ import annotations

import threading

import tensorflow as tf


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
  """Whether ``strategy`` synchronises replicas in several worker processes."""
  return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def chiefs_value(strategy: tf.distribute.Strategy, value: int) -> int:
  """Worker 0's (the chief's) ``value`` on every worker of a multi-worker ``strategy``;
  else ``value``: the secret seed (``make_private``), the first step of a pre-sampled run
  (:meth:`sparse_dp.jobs.sample.SampledBatches.dataset`).

  Every worker must call this at the same point: it runs one collective
  all-gather across the workers.
  """
  if not is_multi_worker(strategy):
    return value
  return _gathered(strategy, value)[0]


def all_agree(strategy: tf.distribute.Strategy, value: int) -> bool:
  """Whether every worker of a multi-worker ``strategy`` gives the same ``value`` (True
  otherwise). Every worker must call this at the same point (one collective all-gather)."""
  return not is_multi_worker(strategy) or len(set(_gathered(strategy, value))) == 1


def refuse_different_batches(strategy: tf.distribute.Strategy, fingerprint: int) -> None:
  """Refuses to train unless every worker of a multi-worker ``strategy`` gives one ``fingerprint``.

  ``fingerprint``: of the first batch a worker's ``fit`` is about to draw
  (:meth:`sparse_dp.training.poisson.poisson_sampling.PoissonPasses.next_batch_fingerprint`),
  0 for input that is not the run's Poisson batches. Every worker computes the
  whole global Poisson batch and trains on its own slice of it, so a step is
  one Poisson sample, as accounted, only if the workers draw the same batches:
  workers that made a different number of ``poisson_dataset`` calls, iterated
  a dataset a different number of times, or hold other data would each slice
  a batch of their own, and an example could then enter one step through two
  workers.
  Every worker must call this at the same point (``fit`` does, on every call):
  it runs one collective all-gather.
  """
  if not all_agree(strategy, fingerprint):
    raise ValueError(
        "sparse-dp: the workers of this multi-worker fit would draw different Poisson batches, "
        "so a step's global batch would not be one Poisson sample and the epsilon would not "
        "hold. Run the same program on every worker: the same training data (all "
        "num_examples examples on each worker), the same private.poisson_dataset(...) calls "
        "in the same order, each dataset iterated only by fit")


def sliced_per_replica(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """``dataset`` of whole global batches, set so that a multi-worker ``fit`` splits each
  batch exactly among the replicas: ``AutoShardPolicy.DATA``.

  ``fit`` (``experimental_distribute_dataset``) splits each batch of unknown
  size into one contiguous slice per replica of the cluster (tf.data's legacy
  rebatching: ``ceil(b / R)`` rows each, the last ones shorter or empty) and,
  under ``DATA``, hands worker ``w`` the slices of its replicas: every worker
  runs the whole pipeline, and a step's slices are exactly its batch, each
  example on one replica. tf.data's default (``AUTO``) shards a pipeline that
  reads files by file (the workers would train batches of other steps in one
  step), and ``OFF`` gives every worker the first slices.
  """
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
  return dataset.with_options(options)


def refuse_unsliced_batches(dataset: tf.data.Dataset) -> None:
  """Refuses a multi-worker ``fit`` on Poisson batches whose ``AutoShardPolicy`` is not
  :func:`sliced_per_replica`'s ``DATA`` (a user's ``with_options`` changed it)."""
  policy = dataset.options().experimental_distribute.auto_shard_policy
  if policy != tf.data.experimental.AutoShardPolicy.DATA:
    raise ValueError(
        f"sparse-dp: the Poisson batches of this multi-worker fit have AutoShardPolicy."
        f"{policy.name}, but only DATA splits each batch exactly among the workers' replicas "
        "(OFF gives every worker the same slices, FILE batches of other steps), so a step "
        "would not be one Poisson sample: leave the dataset's auto_shard_policy as "
        "poisson_dataset (or the sample's batches) set it")


def _gathered(strategy: tf.distribute.Strategy, value: int) -> list[int]:
  """``value`` of every replica of ``strategy``, in replica order (one collective all-gather)."""

  @tf.function
  def every_replicas_value():
    context = tf.distribute.get_replica_context()
    return context.all_gather(tf.constant([value], tf.int64), axis=0)

  gathered = strategy.run(every_replicas_value)
  return [int(v) for v in strategy.experimental_local_results(gathered)[0].numpy()]


def worker_local_variable(strategy: tf.distribute.Strategy, initial_value, **kwargs) -> tf.Variable:
  """A variable of this worker alone under a multi-worker ``strategy`` (as usual otherwise).

  ``MultiWorkerMirroredStrategy`` broadcasts every variable's initial value
  from worker 0 with collectives that take numbers only, so a string variable
  made in its scope fails (``CollectiveBcastSend``: string not allowed). State
  that each worker keeps and assigns itself, outside the replicated step (the
  record of runs, JSON), is made outside the strategy: in a fresh thread,
  whose default graph carries no strategy scope.
  """
  if not is_multi_worker(strategy):
    return tf.Variable(initial_value, **kwargs)
  return _made_outside_strategies(lambda: tf.Variable(initial_value, **kwargs), kwargs.get("name"))


def host_variable(initial_value, **kwargs) -> tf.Variable:
  """A variable of this process's CPU, whatever strategy scope or ``tf.function`` is active.

  For state that a ``tf.data`` pipeline of this process keeps (the pass count
  of a Poisson dataset): a distributed variable (of a strategy's scope) or a
  device one could not be read and assigned by the pipeline on the host.
  """
  def make():
    with tf.device("/cpu:0"):
      return tf.Variable(initial_value, **kwargs)
  return _made_outside_strategies(make, kwargs.get("name"))


def _made_outside_strategies(make, name) -> tf.Variable:
  """``make()`` run in a fresh thread, whose default graph carries no strategy scope."""
  made = []
  thread = threading.Thread(target=lambda: made.append(make()))
  thread.start()
  thread.join()
  if not made:
    raise RuntimeError(f"could not create the variable {name!r} outside the strategy scope")
  return made[0]
