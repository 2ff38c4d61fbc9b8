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


@pytest.mark.parametrize("epochs", [None, 0.05])
def test_a_run_on_a_sample_is_accounted_at_the_manifests_q_for_the_steps_it_trains(
    small_sample, tmp_path, epochs):
  """The train job's DP config on ``--reader batches``: q, N and the steps are the
  manifest's (the MAC-checked sample), and the
  accountant's epsilon over those steps is within the target (the fit is not run)."""
  from sparse_dp.accounting import (
    Algorithm,
    BatchSchedule,
    PrivacyReport,
    PrivacySpec,
    steps_for_epochs,
  )
  from sparse_dp.cli import build_parser
  from sparse_dp.jobs.sample import sample_job
  from sparse_dp.jobs.train import fitting, job_flags
  sample = copy_sample(small_sample / "sample", tmp_path / "sample")
  args = build_parser().parse_args(
      ["train", "--reader", "batches", "--data", str(sample), "--algorithm", "dpsgd",
       "--eval-data", str(small_sample / "data" / "day_0"),
       "--seed-file", str(small_sample / "seed"),
       *(["--epochs", str(epochs)] if epochs else [])])
  batches, _, _, _ = sample_job.sampled_inputs(args, ["dpsgd"], True)
  manifest = batches.manifest
  settings = job_flags.fit_settings(args, epsilon=args.epsilon)
  q = settings.batch_size / batches.num_examples
  assert (settings.batch_size, batches.num_examples) == (manifest.batch_size, 1_000)
  assert q == pytest.approx(manifest.sampling_rate) == pytest.approx(0.02)
  steps = steps_for_epochs(settings.epochs, q)
  assert steps == (5 if epochs is None else 3)  # every unclaimed batch, or ceil(E / q)
  # An untruncated sample (no --max-batch-size) gives the step no bound below its own.
  assert manifest.max_batch_size is None or manifest.max_batch_size >= max(manifest.batch_sizes)
  config = fitting._dp_config(Algorithm.DPSGD, settings, batches.num_examples,
                              settings.batch_size, [])
  spec = PrivacySpec("dpsgd", BatchSchedule.constant(q, steps),
                     noise_multiplier=config.noise_multiplier)
  assert 0.9 < PrivacyReport.compute(spec, 1 / 1_000).epsilon <= 1.0 + 1e-9
