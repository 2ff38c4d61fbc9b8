"""The package owns the sample: fresh Poisson batches every pass, and no epsilon for others."""

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
from scipy import stats

import sparse_dp
from sparse_dp import keras
from sparse_dp.layers import Embedding
from sparse_dp.training.poisson.poisson_sampling import (
  PoissonSample,
  largest_plausible_batch,
  poisson_batches,
  poisson_passes,
)

from support.gaussian_composition import poisson_gaussians_epsilon
from support.keras_models import VOCAB, N, functional_model, synthetic_data
from support.stacks import ALPHA

SIGMA = 1.0


def independent_epsilon(q, steps, delta, sigma=SIGMA):
  """dp_accounting's own PLD epsilon of ``steps`` Poisson-subsampled Gaussian steps."""
  return poisson_gaussians_epsilon(q, steps, delta, sigma)


def record_trained_batches(model):
  """Labels of every batch the model's (DP) train_step is given, as bytes, in order.

  Wraps the installed step, not the dataset: a ``map`` over a Poisson dataset
  would make its batches count as not Poisson.
  """
  seen = []
  step = model.train_step

  def train_step(data):
    _, y = data
    done = tf.py_function(lambda labels: seen.append(labels.numpy().tobytes()) or 0, [y], tf.int64)
    with tf.control_dependencies([done]):
      return step(data)

  model.train_step = train_step
  return seen


def private_model(batch_size=256, num_examples=N, **config):
  model = functional_model()
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig("dpsgd", noise_multiplier=SIGMA, noise_seed=1, **config),
      num_examples=num_examples, batch_size=batch_size)
  return model, private


def test_keras_epochs_over_a_poisson_dataset_draw_fresh_batches_accounted_as_run():
  ids, labels = synthetic_data()
  labels = labels + np.arange(N) * 1e-6  # distinct labels identify the examples of a batch
  model, private = private_model()
  seen = record_trained_batches(model)
  history = model.fit(private.poisson_dataset(ids, labels, epochs=1), epochs=3,
                      verbose=0, callbacks=[private.callback()])
  steps = 3 * 16
  assert len(seen) == steps and len(set(seen)) == len(seen)  # every batch trained on is new
  assert int(private.steps_taken.numpy()) == steps and private.poisson_sampling
  expected = independent_epsilon(256 / N, steps, 1 / N)
  assert private.epsilon() == pytest.approx(expected, rel=1e-3)
  assert history.history["epsilon"][-1] == pytest.approx(expected, rel=1e-3)
  assert private.epsilon(delta=1e-8) == pytest.approx(independent_epsilon(256 / N, steps, 1e-8),
                                                      rel=1e-3)


def test_two_poisson_datasets_draw_different_batches_and_a_fixed_seed_reproduces_both():
  ids, labels = synthetic_data()
  labels = labels + np.arange(N) * 1e-6

  def first_batches():
    _, private = private_model()
    return [next(iter(private.poisson_dataset(ids, labels)))[1].numpy().tobytes()
            for _ in range(2)]

  first = first_batches()
  assert first[0] != first[1]
  assert first_batches() == first  # DPConfig(noise_seed=1): the same run again


def test_passes_are_keyed_by_the_seed_and_their_count_not_by_the_global_seed():
  def two_passes(global_seed):
    tf.random.set_seed(global_seed)  # workers of one job may set theirs apart
    dataset = poisson_batches(np.arange(1000), 0.05, 2, seed=7, stream=3)
    return [[batch.numpy().tolist() for batch in dataset] for _ in range(2)]

  try:
    first = two_passes(1)
    assert first[0] != first[1]  # each pass a fresh sample
    assert two_passes(2) == first
  finally:
    tf.random.set_seed(None)


def test_the_fingerprint_is_that_of_the_next_pass_first_batch():
  def passes(data=np.arange(1000)):
    return poisson_passes(data, 0.05, 2, seed=7, stream=3)

  one, two = passes(), passes()
  start = one.next_batch_fingerprint()
  assert two.next_batch_fingerprint() == start
  list(one.dataset())  # a pass begins: the next is another sample
  assert int(one.passes.numpy()) == 1 and one.next_batch_fingerprint() != start
  list(two.dataset())
  assert two.next_batch_fingerprint() == one.next_batch_fingerprint()
  assert passes(np.arange(1000) + 1).next_batch_fingerprint() != start  # other data


def test_inclusions_over_passes_are_binomial():
  examples, q, steps, passes = 40, 0.3, 25, 12
  dataset = poisson_batches(np.arange(examples), q, steps, seed=7)
  counts = np.zeros(examples)
  pairs = 0  # batches holding both example 0 and example 1
  for _ in range(passes):
    for batch in dataset:
      members = batch.numpy()
      counts[members] += 1
      pairs += {0, 1} <= set(members)
  trials = steps * passes
  # Exact two-sided Binomial intervals, Bonferroni over the 41 tests: ALPHA in all.
  level = ALPHA / (2 * (examples + 1))
  low, high = stats.binom.ppf(level, trials, q), stats.binom.isf(level, trials, q)
  assert np.all((low <= counts) & (counts <= high)), (counts.min(), counts.max(), low, high)
  low, high = stats.binom.ppf(level, trials, q * q), stats.binom.isf(level, trials, q * q)
  assert low <= pairs <= high  # inclusions independent across examples


def test_the_parts_of_a_poisson_batch_are_disjoint_and_make_the_batch():
  sample = PoissonSample(np.arange(1000), 0.1)
  seed = tf.constant([3, 4], tf.int64)
  batch = sample(seed).numpy()
  parts = [sample(seed, tf.constant(part), 3).numpy() for part in range(3)]
  assert len(batch) > 50
  # Contiguous slices: their concatenation is the batch, each example in one part.
  np.testing.assert_array_equal(np.concatenate(parts), batch)
  assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_sampling_rate_one_takes_every_example_every_step():
  ids, labels = synthetic_data()
  ids, labels = ids[:64], labels[:64]
  model, private = private_model(batch_size=64, num_examples=64)
  seen = record_trained_batches(model)
  model.fit(private.poisson_dataset(ids, labels, epochs=2), verbose=0)
  assert len(seen) == 2 and set(seen) == {labels.tobytes()} and private.poisson_sampling
  assert private.epsilon() == pytest.approx(independent_epsilon(1.0, 2, 1 / 64), rel=1e-3)


def test_empty_poisson_batches_are_well_formed_and_train():
  ids, labels = synthetic_data()
  model, private = private_model(batch_size=0.02)  # q N = 0.02: almost every batch is empty
  dataset = private.poisson_dataset(ids, labels, epochs=3 * private.sampling_rate)  # 3 steps
  x, y = next(iter(dataset))
  assert x.shape == (0,) and y.shape == (0,)
  model.fit(dataset, verbose=0)
  assert int(private.steps_taken.numpy()) == 3 and private.poisson_sampling


def test_larger_batch_than_declared_is_refused_with_both_sizes():
  ids, labels = synthetic_data()
  ids, labels = ids[:2000], labels[:2000]
  model, private = private_model(batch_size=20, num_examples=2000)
  with pytest.raises(tf.errors.InvalidArgumentError) as refused:
    model.fit(ids, labels, batch_size=2000, verbose=0)
  message = str(refused.value)
  assert "expected batch size 20 " in message and "[2000]" in message
  assert "at most 56" in message and "poisson_dataset" in message
  assert int(private.steps_taken.numpy()) == 0
  assert largest_plausible_batch(2000, 0.01) == 56


def test_other_inputs_are_counted_their_epsilon_says_not_poisson_and_copies_are_refused():
  ids, labels = synthetic_data()
  model, private = private_model()
  poisson = private.poisson_dataset(ids, labels, epochs=0.25)
  # prefetch/take pass each Poisson batch through; a rebatch or a map does not.
  history = model.fit(poisson.prefetch(1).take(3), verbose=0, callbacks=[private.callback()])
  assert "epsilon" in history.history and private.poisson_sampling
  with pytest.warns(UserWarning, match="unbatch, batch"):
    history = model.fit(poisson.unbatch().batch(256).take(3), verbose=0,
                        callbacks=[private.callback()])
  assert "epsilon" not in history.history and "epsilon_not_poisson" in history.history
  with pytest.warns(UserWarning, match=r"through map.*poisson_dataset\(f\(x\), y\)"):
    history = model.fit(poisson.map(lambda x, y: (x, y)).take(2), verbose=0,
                        callbacks=[private.callback()])
  assert "epsilon_not_poisson" in history.history
  model.train_on_batch(ids[:256], labels[:256])
  model.fit(ids, labels, batch_size=256, epochs=1, steps_per_epoch=2, verbose=0)
  taken, unproved = int(private.steps_taken.numpy()), int(private.state.non_poisson_steps.numpy())
  assert (taken, unproved) == (3 + 3 + 2 + 1 + 2, 3 + 2 + 1 + 2)
  # A map that doubles each batch doubles every example's influence (sensitivity 2 C):
  # refused by the batch size, and not counted.
  doubled = poisson.map(lambda x, y: (tf.concat([x, x], 0), tf.concat([y, y], 0)))
  with pytest.warns(UserWarning, match="through map"),\
       pytest.raises(tf.errors.InvalidArgumentError, match="expected batch size 256 "):
    model.fit(doubled, verbose=0)
  assert int(private.steps_taken.numpy()) == taken
  report = private.report()
  assert not report.poisson_sampling and not report.to_dict()["poisson_sampling"]
  epsilon_line = next(line for line in report.statement().splitlines() if "-DP for" in line)
  assert "NOT a proved epsilon" in epsilon_line
  assert "NOT a proved epsilon" in private.epsilon_text(private.epsilon())


def test_poisson_dataset_of_other_than_num_examples_rows_is_refused_naming_both():
  ids, labels = synthetic_data()
  _, private = private_model()
  with pytest.raises(ValueError, match="has 2,000 rows.*num_examples=4,096"):
    private.poisson_dataset(ids[:2000], labels[:2000])


class NestedFeatures(keras.Model):
  """Dense, ragged and sparse id features in one dict."""

  def __init__(self):
    super().__init__()
    self.ids, self.tags, self.codes = (Embedding(VOCAB, 4) for _ in range(3))
    self.logit = keras.layers.Dense(1)

  def call(self, features):
    return self.logit(tf.concat([self.ids(features["id"]), self.tags(features["tags"]),
                                 self.codes(features["codes"])], axis=1))


def test_nested_features_with_sample_weights_train_through_fit():
  ids, labels = synthetic_data()
  rng = np.random.default_rng(3)
  lengths = rng.integers(0, 4, N)
  features = {
      "id": ids,
      "tags": tf.RaggedTensor.from_row_lengths(rng.integers(0, VOCAB, lengths.sum()), lengths),
      "codes": tf.sparse.from_dense(rng.integers(0, VOCAB, (N, 3)) * (rng.random((N, 3)) < 0.5)),
  }
  weights = pd.Series(rng.random(N).astype("float32"))  # a pandas column
  model = NestedFeatures()
  model.compile(optimizer=keras.optimizers.legacy.SGD(0.5),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  model({"id": ids[:2], "tags": features["tags"][:2],
         "codes": tf.sparse.slice(features["codes"], [0, 0], [2, 3])})
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig("adafest", sigma1=3.0, sigma2=0.8, noise_seed=1),
      num_examples=N, batch_size=256)
  x, y, w = next(iter(private.poisson_dataset(features, labels, weights)))
  assert isinstance(x["tags"], tf.RaggedTensor) and isinstance(x["codes"], tf.SparseTensor)
  assert x["tags"].nrows() == x["codes"].dense_shape[0] == len(y) == len(w)
  history = model.fit(private.poisson_dataset(features, labels, weights, epochs=0.5),
                      verbose=0, callbacks=[private.callback()])
  assert int(private.steps_taken.numpy()) == 8 and private.poisson_sampling
  assert history.history["epsilon"][-1] > 0
