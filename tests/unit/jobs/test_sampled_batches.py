"""A Beam sample's batches as runs read them: once each, in step order, under step claims."""

import pytest

from support.beam_samples import SEED, copy_sample, write_small_sample


@pytest.fixture(scope="module")
def small_sample(tmp_path_factory):
  return write_small_sample(tmp_path_factory.mktemp("small"))


def test_batches_are_read_once_in_step_order_by_every_run(small_sample, tmp_path):
  from sparse_dp.jobs.sample import step_claims
  from sparse_dp.jobs.sample.batches import SampledBatches
  from sparse_dp.models.pctr_data import hashed_vocabulary
  sample = str(copy_sample(small_sample / "sample", tmp_path / "sample"))
  batches = SampledBatches.open(sample, hashed_vocabulary(0.01), SEED)
  later_run = SampledBatches.open(sample, hashed_vocabulary(0.01), SEED)  # another process's
  sizes = [int(y.shape[0]) for _, y in batches.dataset(3)]
  assert sizes == batches.manifest.batch_sizes[:3]
  # The later run starts after the steps the first one claimed, not at step 0.
  assert later_run.batches_left == 2
  assert [int(y.shape[0]) for _, y in later_run.dataset(1)] == [batches.manifest.batch_sizes[3]]
  rest = batches.dataset(1)
  assert [int(y.shape[0]) for _, y in rest] == [batches.manifest.batch_sizes[4]]
  assert not list(rest) and not list(rest.repeat(3))  # never again
  assert [(c.first, c.end) for c in step_claims.claims(sample)] == [(0, 3), (3, 4), (4, 5)]
  with pytest.raises(ValueError, match="0 unread batches of 5 .5 taken by this or earlier"):
    SampledBatches.open(sample, hashed_vocabulary(0.01), SEED).dataset(1)
  # Two runs that read the claims at once want the same first step: the second is refused.
  with pytest.raises(ValueError, match="claimed the sample's batches from step 4 at the same"):
    step_claims.claim(sample, 4, 5)
  assert sorted(p.name for p in (tmp_path / "sample" / step_claims.CLAIMS).iterdir()) == [
      "from-000000000.json", "from-000000003.json", "from-000000004.json"]  # no partial file
  damaged = copy_sample(small_sample / "sample", tmp_path / "damaged")
  (damaged / step_claims.CLAIMS).mkdir()
  (damaged / step_claims.CLAIMS / "from-000000000.json").write_text('{"first": 0')
  with pytest.raises(ValueError, match="from-000000000.json is not readable"):
    SampledBatches.open(str(damaged), hashed_vocabulary(0.01), SEED)
  unwritable = copy_sample(small_sample / "sample", tmp_path / "unwritable")
  (unwritable / step_claims.CLAIMS).write_text("a file where the claims folder goes")
  with pytest.raises(ValueError, match="cannot record which batches this run trains on"):
    SampledBatches.open(str(unwritable), hashed_vocabulary(0.01), SEED).dataset(1)
