"""What every worker of a multi-worker strategy must agree on before the first step.

Under ``tf.distribute.MultiWorkerMirroredStrategy`` each worker process runs
the same program and calls ``make_private`` itself. The DP step derives the
row selection and the noise of step ``t`` from one secret seed (core paper
Algorithm 1, lines 6-8 and 11): every worker must hold the *same* seed, or each
replica would mask its examples to another selection, the all-reduced sum
would carry un-noised gradients on rows the noising replica never selected,
and the Poisson samples of the workers would differ. A seed drawn from the OS
on each worker (the default) is therefore replaced by worker 0's, gathered
over the strategy's collectives; the seed never leaves the cluster.

Each worker then draws the whole global Poisson batch of a step and trains on
its own slice of it, so the workers must draw the same batches: their keys
depend only on the seed, the dataset's number and its pass count
(:mod:`sparse_dp.training.sampling`), and ``fit`` compares a fingerprint of
its first batch across the workers before it trains (:func:`refuse_different_batches`).
"""

from __future__ import annotations

import threading

import tensorflow as tf


def is_multi_worker(strategy: tf.distribute.Strategy) -> bool:
  """Whether ``strategy`` synchronises replicas in several worker processes."""
  return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def shared_seed(strategy: tf.distribute.Strategy, seed: int) -> int:
  """Worker 0's ``seed`` on every worker of a multi-worker ``strategy``; else ``seed``.

  Every worker must call this at the same point (``make_private`` does): it
  runs one collective all-gather across the workers.
  """
  if not is_multi_worker(strategy):
    return seed
  return _gathered(strategy, seed)[0]


def refuse_different_batches(strategy: tf.distribute.Strategy, fingerprint: int) -> None:
  """Refuses to train unless every worker of a multi-worker ``strategy`` gives one ``fingerprint``.

  ``fingerprint``: of the first batch a worker's ``fit`` is about to draw
  (:meth:`sparse_dp.training.sampling.PoissonPasses.next_batch_fingerprint`),
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
  if not is_multi_worker(strategy):
    return
  if len(set(_gathered(strategy, fingerprint))) > 1:
    raise ValueError(
        "sparse-dp: the workers of this multi-worker fit would draw different Poisson batches, "
        "so a step's global batch would not be one Poisson sample and the epsilon would not "
        "hold. Run the same program on every worker: the same training data (all "
        "num_examples examples on each worker), the same private.poisson_dataset(...) calls "
        "in the same order, each dataset iterated only by fit")


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
