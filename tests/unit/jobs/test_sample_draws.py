"""Beam sampling's parts: keyed Poisson draws, the pipeline's batches and its manifest checks."""

import json

import numpy as np
import pytest
from scipy import stats

from sparse_dp.jobs.sample import pipeline
from sparse_dp.jobs.sample.draws import SecretSeed, example_key

from support.beam_samples import (
  SALT,
  SEED,
  draw_sample,
  numbered_lines,
  read_batches,
  shared_examples,
  write_days,
)
from support.stacks import ALPHA

KEY = SEED.for_sample(SALT)


def _chi_square_p(counts: np.ndarray, probabilities: np.ndarray) -> float:
  """P-value of observed ``counts`` against ``probabilities``, bins pooled to expected >= 5."""
  expected = probabilities / probabilities.sum() * counts.sum()
  pooled_obs, pooled_exp, obs, exp = [], [], 0.0, 0.0
  for o, e in zip(counts, expected):
    obs, exp = obs + o, exp + e
    if exp >= 5:
      pooled_obs.append(obs)
      pooled_exp.append(exp)
      obs, exp = 0.0, 0.0
  pooled_obs[-1] += obs
  pooled_exp[-1] += exp
  statistic = sum((o - e) ** 2 / e for o, e in zip(pooled_obs, pooled_exp))
  return float(stats.chi2.sf(statistic, len(pooled_obs) - 1))


def _check_binomial_laws(inclusions: np.ndarray, rate: float) -> None:
  """``inclusions[example, step]``: batch sizes ~ Binomial(N, q), counts ~ Binomial(T, q)."""
  num_examples, steps = inclusions.shape
  sizes = inclusions.sum(axis=0)
  # Dispersion: sum (x - Nq)^2 / (Nq(1-q)) ~ chi2(T) (normal approximation, Nq >= 50).
  dispersion = float(np.sum((sizes - num_examples * rate) ** 2)
                     / (num_examples * rate * (1 - rate)))
  p_sizes = min(stats.chi2.sf(dispersion, steps), stats.chi2.cdf(dispersion, steps))
  assert p_sizes > ALPHA / 4, (sizes, dispersion)  # a fixed-size sampler: dispersion 0
  counts = np.bincount(inclusions.sum(axis=1), minlength=steps + 1)
  law = stats.binom.pmf(np.arange(steps + 1), steps, rate)
  # Without replacement (each example at most once per epoch), no count would exceed 1.
  assert _chi_square_p(counts, law) > ALPHA / 4, counts[:6]


def test_keyed_draws_match_binomial_laws_and_skip_correctly():
  num_examples, steps, rate = 40_000, 100, 0.02
  inclusions = np.zeros((num_examples, steps), np.int64)
  for example in range(num_examples):
    inclusions[example, KEY.inclusion_steps(example_key("day_0", example), rate, steps)] = 1
  _check_binomial_laws(inclusions, rate)
  # Geometric skips are Bernoulli draws: consecutive steps are joined independently.
  both = int(np.sum(inclusions[:, :-1] * inclusions[:, 1:]))
  pairs = num_examples * (steps - 1)
  assert stats.binomtest(both, pairs, rate**2).pvalue > ALPHA / 4
  assert KEY.inclusion_steps(b"x", rate, steps) == KEY.inclusion_steps(b"x", rate, steps)


def test_pipeline_batches_are_poisson_samples_of_every_file(tmp_path):
  paths = write_days(tmp_path / "data", [2500, 1500, 2000])
  steps, batch_size = 48, 60  # q = 0.01 of 6,000 examples
  manifest = draw_sample(paths, tmp_path / "out", batch_size=batch_size, steps=steps,
                         batches_per_shard=10)
  assert (manifest["num_examples"], manifest["sampling_rate"]) == (6000, 0.01)
  assert [s["file"] for s in manifest["shards"]] == [
      f"batches-{i:05d}-of-00005.tfrecord" for i in range(5)]
  index = {line: i for i, line in enumerate(numbered_lines(0, 6000))}
  inclusions = np.zeros((6000, steps), np.int64)
  for step, batch in enumerate(read_batches(tmp_path / "out")):
    inclusions[[index[line] for line in batch], step] = 1  # each line is one example
  _check_binomial_laws(inclusions, 0.01)
  assert manifest["salt"] == SALT and "seed" not in json.dumps(manifest["inputs"])
  assert SEED._key.hex() not in json.dumps(manifest) and KEY._key.hex() not in json.dumps(manifest)


def test_same_seed_and_salt_same_batches_whatever_the_order_or_sharding(tmp_path):
  paths = write_days(tmp_path / "data", [400, 300, 300])
  spec = dict(batch_size=30, steps=12)
  draw_sample(paths, tmp_path / "a", batches_per_shard=5, **spec)
  draw_sample(paths[::-1], tmp_path / "b", batches_per_shard=2, num_examples=1000, **spec)
  draw_sample(paths, tmp_path / "c", seed=SecretSeed(b"another seed, 32 bytes long...."),
              batches_per_shard=5, **spec)
  draw_sample(paths, tmp_path / "d", batches_per_shard=5, max_batch_size=28, **spec)
  draw_sample(paths, tmp_path / "e", salt="5a18" * 8, batches_per_shard=5, **spec)
  first, again, other, cut, salted = (read_batches(tmp_path / name) for name in "abcde")
  assert first == again
  assert len(first) == len(other) == len(salted) == 12
  # Another seed, or the same seed with another salt: independent batches, in whose batch
  # of one step an example is twice with probability q^2 (10.8 expected of 1000 x 12).
  for independent in (other, salted):
    assert stats.binom.sf(shared_examples(first, independent) - 1, 1000 * 12, 0.03**2) > ALPHA / 4
  # Truncation keeps a subset of at most M of the same batch (same seed).
  assert any(len(whole) > 28 for whole in first)
  for whole, kept in zip(first, cut):
    assert len(kept) == min(len(whole), 28) and set(kept) <= set(whole)


def test_a_wrong_number_of_examples_is_refused_before_the_manifest_is_written(tmp_path):
  paths = write_days(tmp_path / "data", [600, 400])
  with pytest.raises(ValueError, match="--num-examples 999 but the files hold 1,000"):
    draw_sample(paths, tmp_path / "out", batch_size=20, steps=2, num_examples=999)
  assert not (tmp_path / "out" / "manifest.json").exists()
  # N counted by the first pass, another N read by the draw pass: the files changed.
  spec = pipeline.SampleSpec(paths=tuple(paths), out=str(tmp_path / "out"), batch_size=20,
                             steps=2, salt=SALT)
  with pytest.raises(ValueError, match="1,000 valid examples when counted but 999 when drawn"):
    pipeline._write_manifest([], spec, [{"examples": 600}, {"examples": 399}], 1000, SEED)
