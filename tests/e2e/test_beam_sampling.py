"""``sparse-dp sample`` (Poisson sampling on Beam, DirectRunner) and ``train --reader batches``.

Statistical checks use a fixed seed (deterministic); ``ALPHA`` is the chance
that a correct sampler would fail them for a random seed.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from sparse_dp.cli import main
from sparse_dp.data.vocabulary import Vocabulary
from sparse_dp.jobs.sample import pipeline
from sparse_dp.jobs.sample.draws import SecretSeed, example_key

from support.criteo_lines import HAND_WRITTEN, write
from support.ports import free_ports
from support.stacks import ALPHA, one_stack

SEED_BYTES = b"test seed: not a secret, 32 byte"
SEED = SecretSeed(SEED_BYTES)
SALT = "5a17" * 8
KEY = SEED.for_sample(SALT)


def _lines(first: int, count: int) -> list[str]:
  """Valid Criteo lines made unique by their int_1 (the example's global number)."""
  head, rest = HAND_WRITTEN[0].split("\t", 2)[0], HAND_WRITTEN[0].split("\t", 2)[2]
  return [f"{head}\t{first + i}\t{rest}" for i in range(count)]


def _write_files(folder: pathlib.Path, counts) -> list[str]:
  folder.mkdir()
  first, paths = 0, []
  for day, count in enumerate(counts):
    paths.append(str(write(folder / f"day_{day}", _lines(first, count))))
    first += count
  return paths


def _sample(paths, out, seed=SEED, salt=SALT, **spec) -> dict:
  spec = pipeline.SampleSpec(paths=tuple(paths), out=str(out), salt=salt, **spec)
  pipeline.run(spec, seed)
  return json.loads((pathlib.Path(out) / "manifest.json").read_text())


def _batches(out) -> list[list[str]]:
  """The lines of each step's batch, in step order, read from the shards."""
  import tensorflow as tf
  manifest = json.loads((pathlib.Path(out) / "manifest.json").read_text())
  batches = []
  for shard in manifest["shards"]:
    for record in tf.data.TFRecordDataset(str(pathlib.Path(out) / shard["file"])):
      example = tf.train.Example.FromString(record.numpy())
      assert example.features.feature["step"].int64_list.value[0] == len(batches)
      batches.append([v.decode() for v in example.features.feature["lines"].bytes_list.value])
  assert [len(b) for b in batches] == [s for sh in manifest["shards"] for s in sh["batch_sizes"]]
  return batches


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
  paths = _write_files(tmp_path / "data", [2500, 1500, 2000])
  steps, batch_size = 48, 60  # q = 0.01 of 6,000 examples
  manifest = _sample(paths, tmp_path / "out", batch_size=batch_size, steps=steps,
                     batches_per_shard=10)
  assert (manifest["num_examples"], manifest["sampling_rate"]) == (6000, 0.01)
  assert [s["file"] for s in manifest["shards"]] == [
      f"batches-{i:05d}-of-00005.tfrecord" for i in range(5)]
  index = {line: i for i, line in enumerate(_lines(0, 6000))}
  inclusions = np.zeros((6000, steps), np.int64)
  for step, batch in enumerate(_batches(tmp_path / "out")):
    inclusions[[index[line] for line in batch], step] = 1  # each line is one example
  _check_binomial_laws(inclusions, 0.01)
  assert manifest["salt"] == SALT and "seed" not in json.dumps(manifest["inputs"])
  assert SEED._key.hex() not in json.dumps(manifest) and KEY._key.hex() not in json.dumps(manifest)


def _shared(first: list[list[str]], second: list[list[str]]) -> int:
  """Examples in both samples' batch of the same step, over all steps."""
  return sum(len(set(a) & set(b)) for a, b in zip(first, second))


def test_same_seed_and_salt_same_batches_whatever_the_order_or_sharding(tmp_path):
  paths = _write_files(tmp_path / "data", [400, 300, 300])
  spec = dict(batch_size=30, steps=12)
  _sample(paths, tmp_path / "a", batches_per_shard=5, **spec)
  _sample(paths[::-1], tmp_path / "b", batches_per_shard=2, num_examples=1000, **spec)
  _sample(paths, tmp_path / "c", seed=SecretSeed(b"another seed, 32 bytes long...."),
          batches_per_shard=5, **spec)
  _sample(paths, tmp_path / "d", batches_per_shard=5, max_batch_size=28, **spec)
  _sample(paths, tmp_path / "e", salt="5a18" * 8, batches_per_shard=5, **spec)
  first, again, other, cut, salted = (_batches(tmp_path / name) for name in "abcde")
  assert first == again
  assert len(first) == len(other) == len(salted) == 12
  # Another seed, or the same seed with another salt: independent batches, in whose batch
  # of one step an example is twice with probability q^2 (10.8 expected of 1000 x 12).
  for independent in (other, salted):
    assert stats.binom.sf(_shared(first, independent) - 1, 1000 * 12, 0.03**2) > ALPHA / 4
  # Truncation keeps a subset of at most M of the same batch (same seed).
  assert any(len(whole) > 28 for whole in first)
  for whole, kept in zip(first, cut):
    assert len(kept) == min(len(whole), 28) and set(kept) <= set(whole)


def test_a_wrong_number_of_examples_is_refused_before_the_manifest_is_written(tmp_path):
  paths = _write_files(tmp_path / "data", [600, 400])
  with pytest.raises(ValueError, match="--num-examples 999 but the files hold 1,000"):
    _sample(paths, tmp_path / "out", batch_size=20, steps=2, num_examples=999)
  assert not (tmp_path / "out" / "manifest.json").exists()
  # N counted by the first pass, another N read by the draw pass: the files changed.
  spec = pipeline.SampleSpec(paths=tuple(paths), out=str(tmp_path / "out"), batch_size=20,
                             steps=2, salt=SALT)
  with pytest.raises(ValueError, match="1,000 valid examples when counted but 999 when drawn"):
    pipeline._write_manifest([], spec, [{"examples": 600}, {"examples": 399}], 1000, SEED)


@pytest.fixture(scope="module")
def criteo_days(tmp_path_factory):
  """Five synthetic Criteo files, 40,040 examples in all (2,002 lines written 4 times each).

  The pipeline streams its files (Beam), so their size is not what the test checks: at
  400,040 examples, more than ``--reader pandas`` holds, it took two CI minutes."""
  from sparse_dp.data.synthetic import SyntheticCriteo
  folder = tmp_path_factory.mktemp("criteo")
  synthetic = SyntheticCriteo(scale=0.01)
  for day in range(1, 6):
    text = "\n".join(synthetic.lines(day, 2_002)) + "\n"
    (folder / f"day_{day}").write_text(text * 4)
  eval_path = synthetic.write_day(folder / "eval_day", 6, 100)
  return folder, 5 * 4 * 2_002, eval_path


@pytest.mark.slow
@one_stack("tf2.21")
def test_sample_then_train_on_the_batches_with_the_accountants_epsilon(tmp_path, capsys,
                                                                       criteo_days):
  from sparse_dp.accounting import PrivacyAccountant
  folder, num_examples, eval_path = criteo_days
  seed_file = tmp_path / "seed"
  seed_file.write_bytes(b"0123456789abcdef0123456789abcdef")
  out = tmp_path / "sample"
  assert main(["sample", "--data", str(folder / "day_*"), "--batch-size", "64", "--steps", "4",
               "--out", str(out), "--num-examples", str(num_examples),
               "--seed-file", str(seed_file), "--json"]) == 0
  summary = json.loads(capsys.readouterr().out)
  assert summary["num_examples"] == num_examples and summary["poisson_sampling"] is True
  assert b"0123456789abcdef" not in b"".join(p.read_bytes() for p in out.iterdir())
  vocabulary = tmp_path / "vocabulary.json"  # small public tables: a cheap model
  Vocabulary.hashed([50] * 26).save(vocabulary)
  assert main(["train", "--reader", "batches", "--data", str(out), "--eval-data", str(eval_path),
               "--algorithm", "dpsgd", "--hidden-units", "4", "--vocabulary", str(vocabulary),
               "--seed-file", str(seed_file), "--out", str(tmp_path / "model"),
               "--noise-seed", "3", "--json"]) == 0
  metrics = json.loads(capsys.readouterr().out)
  q = 64 / num_examples
  assert metrics["poisson_sampling"] is True and metrics["steps"] == 4
  assert metrics["train_examples"] == num_examples and "privacy_caveat" not in metrics
  accountant = PrivacyAccountant("pld").step(metrics["noise_multipliers"]["sigma"], q, 4)
  assert metrics["epsilon"] == pytest.approx(accountant.get_epsilon(1 / num_examples), rel=1e-9)
  assert 0 < metrics["epsilon"] <= 1.0 + 1e-9
  # A second model on the same batches would not be a second Poisson sample: refused.
  assert main(["train", "--reader", "batches", "--data", str(out), "--eval-data", str(eval_path),
               "--algorithm", "adafest", "--vocabulary", str(vocabulary),
               "--seed-file", str(seed_file), "--out", str(tmp_path / "again")]) == 2
  assert "all 4 batches of the sample were claimed by earlier runs" in capsys.readouterr().err


@pytest.fixture(scope="module")
def small_sample(tmp_path_factory):
  folder = tmp_path_factory.mktemp("small")
  paths = _write_files(folder / "data", [600, 400])
  _sample(paths, folder / "sample", batch_size=20, steps=5, batches_per_shard=2)
  (folder / "seed").write_bytes(SEED_BYTES)
  return folder


def _error(capsys, argv) -> str:
  assert main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1, err
  return err[0]


def test_sample_refuses_bad_inputs_in_one_line(tmp_path, capsys, small_sample):
  data = str(small_sample / "data" / "day_*")
  # The seed's key never travels in a pipeline, only the seed file's path: no seed file,
  # no sample, refused before anything is staged or written.
  remote = tmp_path / "remote"
  assert "--seed-file is required" in _error(capsys, [
      "sample", "--data", data, "--steps", "3", "--out", str(remote), "--runner", "DataflowRunner"])
  assert not remote.exists()
  seed_file = str(small_sample / "seed")
  base = ["sample", "--data", data, "--steps", "3", "--seed-file", seed_file]
  assert "--out needed" in _error(capsys, base)
  assert "matches no file" in _error(capsys, ["sample", "--data", str(tmp_path / "no_*"),
                                              "--steps", "3", "--out", str(tmp_path / "o"),
                                              "--seed-file", seed_file])
  assert "q = batch_size / N must be < 1" in _error(
      capsys, base + ["--out", str(tmp_path / "o"), "--batch-size", "1000",
                      "--num-examples", "1000"])
  assert "is not empty" in _error(capsys, base + ["--out", str(small_sample / "sample")])
  (tmp_path / "o2").mkdir()
  (tmp_path / "o2" / "seed").write_bytes(b"x" * 32)
  assert "beside the batches" in _error(
      capsys, base + ["--out", str(tmp_path / "o2"), "--seed-file", str(tmp_path / "o2" / "seed")])
  (tmp_path / "short").write_bytes(b"x" * 4)
  assert "at least 16 bytes" in _error(
      capsys, base + ["--out", str(tmp_path / "o3"), "--seed-file", str(tmp_path / "short")])


@pytest.mark.slow
@one_stack("tf2.21")  # an end-to-end run; its library code has unit tests on both stacks
def test_train_refuses_what_would_make_the_epsilon_wrong(tmp_path, capsys, small_sample):
  sample = small_sample / "sample"
  base = ["train", "--reader", "batches", "--eval-data", str(small_sample / "data" / "day_0"),
          "--hidden-units", "4", "--out", str(tmp_path / "m"),
          "--seed-file", str(small_sample / "seed")]
  assert "contradicts the sample's batch size 20" in _error(
      capsys, base + ["--data", str(sample), "--batch-size", "32"])
  assert "not a Poisson sample" in _error(capsys, base + ["--data", str(sample), "--epochs", "1"])
  assert "top-k preselection" in _error(capsys, base + ["--data", str(sample),
                                                        "--algorithm", "fest"])
  assert "trains one model per sample" in _error(capsys, base + ["--data", str(sample),
                                                                "--compare", "dpsgd,adafest"])
  assert "no manifest.json" in _error(capsys, base + ["--data", str(small_sample / "data")])
  changed, missing = tmp_path / "changed", tmp_path / "missing"
  for copy in (changed, missing):
    copy.mkdir()
    for path in sample.iterdir():
      (copy / path.name).write_bytes(path.read_bytes())
  shard = sorted(changed.glob("*.tfrecord"))[1]
  shard.write_bytes(shard.read_bytes()[:-1] + b"\0")
  # Each shard is checked as it is opened: the run stops at the changed one, in one line.
  assert main(base + ["--data", str(changed)]) == 2
  assert "sparse-dp train: error: sparse-dp: a sample shard does not match the manifest" in (
      capsys.readouterr().err.strip().splitlines()[-1])
  sorted(missing.glob("*.tfrecord"))[0].unlink()
  assert "shard(s) of the manifest are missing" in _error(capsys, base + ["--data", str(missing)])
  assert "needs --seed-file" in _error(capsys, base[:-2] + ["--data", str(sample)])
  assert "--seed-file is for --reader batches" in _error(
      capsys, ["train", "--reader", "tfdata", "--seed-file", str(small_sample / "seed")])
  other_seed = tmp_path / "other_seed"
  other_seed.write_bytes(b"another seed, 32 bytes long....")
  assert "MAC does not match --seed-file" in _error(
      capsys, base[:-1] + [str(other_seed), "--data", str(sample)])
  # N and q edited consistently (a smaller q, a smaller epsilon): the MAC refuses it.
  edited = _copy(sample, tmp_path / "edited")
  manifest = json.loads((edited / "manifest.json").read_text())
  manifest.update(num_examples=2 * manifest["num_examples"],
                  sampling_rate=manifest["batch_size"] / (2 * manifest["num_examples"]))
  (edited / "manifest.json").write_text(json.dumps(manifest))
  assert "MAC does not match --seed-file" in _error(capsys, base + ["--data", str(edited)])


def _copy(sample: pathlib.Path, to: pathlib.Path) -> pathlib.Path:
  to.mkdir()
  for path in sample.glob("*.*"):
    (to / path.name).write_bytes(path.read_bytes())
  return to


def test_batches_are_read_once_in_step_order_by_every_run(small_sample, tmp_path):
  from sparse_dp.jobs.sample import step_claims
  from sparse_dp.jobs.sample.batches import SampledBatches
  from sparse_dp.models.pctr_data import hashed_vocabulary
  sample = str(_copy(small_sample / "sample", tmp_path / "sample"))
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
  damaged = _copy(small_sample / "sample", tmp_path / "damaged")
  (damaged / step_claims.CLAIMS).mkdir()
  (damaged / step_claims.CLAIMS / "from-000000000.json").write_text('{"first": 0')
  with pytest.raises(ValueError, match="from-000000000.json is not readable"):
    SampledBatches.open(str(damaged), hashed_vocabulary(0.01), SEED)
  unwritable = _copy(small_sample / "sample", tmp_path / "unwritable")
  (unwritable / step_claims.CLAIMS).write_text("a file where the claims folder goes")
  with pytest.raises(ValueError, match="cannot record which batches this run trains on"):
    SampledBatches.open(str(unwritable), hashed_vocabulary(0.01), SEED).dataset(1)


@pytest.mark.slow
@one_stack("tf2.15")
def test_two_workers_train_on_a_sample_as_one_process(small_sample, tmp_path):
  """``train --reader batches --strategy multi-worker`` on two localhost workers: each step's
  batch is split between them, the chief alone claims the steps, and the model is the one
  a single process trains on the same batches (a fresh copy of the sample)."""
  import tensorflow as tf

  from sparse_dp.jobs.sample import step_claims
  vocabulary = tmp_path / "vocabulary.json"
  Vocabulary.hashed([50] * 26).save(vocabulary)

  def train(sample: pathlib.Path, out: pathlib.Path, strategy: str) -> list[str]:
    return ["train", "--reader", "batches", "--data", str(_copy(small_sample / "sample", sample)),
            "--eval-data", str(small_sample / "data" / "day_0"), "--algorithm", "dpsgd",
            "--categorical-features", "2",
            "--hidden-units", "4", "--vocabulary", str(vocabulary), "--seed-file",
            str(small_sample / "seed"), "--epochs", "0.06", "--noise-seed", "3",
            "--strategy", strategy, "--out", str(out), "--json"]

  addresses = [f"127.0.0.1:{port}" for port in free_ports(2)]
  cluster = train(tmp_path / "cluster_sample", tmp_path / "cluster", "multi-worker")
  environments = [dict(os.environ, TF_CONFIG=json.dumps(
      {"cluster": {"worker": addresses}, "task": {"type": "worker", "index": index}}))
                  for index in range(2)]
  environments.append({k: v for k, v in os.environ.items() if k != "TF_CONFIG"})
  commands = [cluster, cluster, train(tmp_path / "alone_sample", tmp_path / "alone", "default")]
  processes = [subprocess.Popen([sys.executable, "-m", "sparse_dp", *argv], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                # Outside the checkout: its sparse_dp/ has no models/
                                # (installed as sparse_dp.models) and would shadow the package.
                                cwd=tmp_path, env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"})
               for argv, env in zip(commands, environments)]
  try:
    for process in processes:
      out, err = process.communicate(timeout=600)
      assert process.returncode == 0, err[-3000:]
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
  alone = json.loads(out.strip().splitlines()[-1])
  runs = [tmp_path / "cluster", tmp_path / "cluster" / "workers" / "worker_1"]
  # q = 20 / 1,000: 3 steps; each counted once, claimed once (by the chief).
  assert [(c.first, c.end)
          for c in step_claims.claims(str(tmp_path / "cluster_sample"))] == [(0, 3)]
  for run in runs:
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["steps"] == alone["steps"] == 3 and metrics["poisson_sampling"] is True
    assert metrics["epsilon"] == pytest.approx(alone["epsilon"], rel=1e-12)
  weights = [tf.train.load_checkpoint(str(run / "model" / "variables" / "variables"))
             for run in [tmp_path / "alone", *runs]]
  names = [n for n in weights[0].get_variable_to_shape_map()
           if np.asarray(weights[0].get_tensor(n)).dtype.kind == "f"]
  assert len(names) > 10
  for name in names:
    for worker in weights[1:]:
      # Workers reading other shards (tf.data's file sharding: batches of other steps in a
      # step) move the Dense layers and their Adam moments by up to 16% of their size.
      np.testing.assert_allclose(worker.get_tensor(name), weights[0].get_tensor(name),
                                 rtol=1e-4, atol=1e-5, err_msg=name)


def test_samples_of_one_seed_file_never_repeat_and_reproduce_only_in_place(tmp_path, capsys):
  from sparse_dp.jobs.sample import sample_ledger, step_claims
  _write_files(tmp_path / "data", [600, 400])
  seed_file = tmp_path / "secret" / "seed"
  seed_file.parent.mkdir()
  seed_file.write_bytes(SEED_BYTES)
  argv = ["sample", "--data", str(tmp_path / "data" / "day_*"), "--batch-size", "20",
          "--steps", "6", "--batches-per-shard", "2", "--seed-file", str(seed_file), "--json"]
  for name in "ab":
    assert main(argv + ["--out", str(tmp_path / name)]) == 0
  salts = [json.loads(line)["salt"] for line in capsys.readouterr().out.splitlines()]
  first, second = _batches(tmp_path / "a"), _batches(tmp_path / "b")
  # Two samples with one seed file: fresh salts, independent batches (each example is in
  # both batches of a step with probability q^2: 2.4 expected of 1000 x 6).
  assert len(set(salts)) == 2 and len(first) == len(second) == 6
  assert stats.binom.sf(_shared(first, second) - 1, 1000 * 6, 0.02**2) > ALPHA / 4
  assert sorted(p.name for p in (tmp_path / "secret" / "seed.samples").iterdir()) == sorted(
      f"{salt}.json" for salt in salts)
  with pytest.raises(ValueError, match="was drawn before"):
    sample_ledger.record(str(seed_file), salts[0], str(tmp_path / "c"))
  # --reproduce draws a sample again into its own folder, under its claims: it restores a
  # lost shard as it was written, and the manifest stays.
  sample = tmp_path / "a"
  lost = sorted(sample.glob("*.tfrecord"))[1]
  written, manifest = lost.read_bytes(), (sample / "manifest.json").read_text()
  lost.unlink()
  step_claims.claim(str(sample), 0, 2)
  assert main(["sample", "--reproduce", str(sample), "--seed-file", str(seed_file)]) == 0
  assert lost.read_bytes() == written and (sample / "manifest.json").read_text() == manifest
  assert step_claims.steps_taken(str(sample)) == 2
  # Nowhere else: a copy would hold the batches without the claims.
  copy = _copy(sample, tmp_path / "copy")
  assert "was drawn into" in _error(capsys, ["sample", "--reproduce", str(copy),
                                             "--seed-file", str(seed_file)])
  assert "leave out --steps" in _error(capsys, ["sample", "--reproduce", str(sample),
                                                "--steps", "8", "--seed-file", str(seed_file)])
  # Input files changed since: refused, and the manifest is left as it was.
  day_1 = tmp_path / "data" / "day_1"
  day_1.write_text(day_1.read_text().replace("\t600\t", "\t9600\t"))
  assert "input files changed since: day_1" in _error(
      capsys, ["sample", "--reproduce", str(sample), "--seed-file", str(seed_file)])
  assert (sample / "manifest.json").read_text() == manifest


_TRUNCATION = pytest.importorskip("dp_accounting")
HAS_TRUNCATED_EVENT = hasattr(_TRUNCATION, "TruncatedSubsampledGaussianDpEvent")


@pytest.mark.skipif(not HAS_TRUNCATED_EVENT, reason="dp-accounting < 0.5.1 (the 3.11 stack)")
def test_truncated_epsilon_matches_untruncated_far_above_and_grows_below():
  from sparse_dp.accounting import PrivacyAccountant, Truncation
  num_examples, batch_size, steps, sigma = 100_000, 1_000, 10, 1.0
  q, delta = batch_size / num_examples, 1e-5
  plain = PrivacyAccountant().step(sigma, q, steps).get_epsilon(delta)
  far = PrivacyAccountant().step(sigma, q, steps, Truncation(num_examples, 2 * batch_size))
  assert far.get_epsilon(delta) == pytest.approx(plain, rel=1e-6)
  tight = PrivacyAccountant().step(sigma, q, steps, Truncation(num_examples, batch_size))
  assert tight.get_epsilon(delta) > plain * 1.01


@pytest.mark.skipif(HAS_TRUNCATED_EVENT, reason="dp-accounting >= 0.5.1 accounts truncation")
def test_truncation_is_refused_where_it_cannot_be_accounted():
  from sparse_dp.accounting import Truncation
  with pytest.raises(ValueError, match="dp-accounting >= 0.5.1"):
    Truncation(100_000, 2_000)
