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

from support.beam_samples import (
  SEED_BYTES,
  copy_sample,
  read_batches,
  shared_examples,
  write_days,
  write_small_sample,
)
from support.ports import free_ports
from support.stacks import ALPHA, one_stack


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
               "--categorical-features", "2",
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
  return write_small_sample(tmp_path_factory.mktemp("small"))


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


def _train_on_sample(small_sample, tmp_path) -> list:
  """``sparse-dp train --reader batches`` on the small sample, less its ``--data``."""
  return ["train", "--reader", "batches", "--eval-data", str(small_sample / "data" / "day_0"),
          "--hidden-units", "4", "--categorical-features", "2", "--out", str(tmp_path / "m"),
          "--seed-file", str(small_sample / "seed")]


def test_train_refuses_what_would_make_the_epsilon_wrong(tmp_path, capsys, small_sample):
  """Each refusal comes before the first step (both stacks, the fast tier)."""
  sample = small_sample / "sample"
  base = _train_on_sample(small_sample, tmp_path)
  assert "contradicts the sample's batch size 20" in _error(
      capsys, base + ["--data", str(sample), "--batch-size", "32"])
  assert "not a Poisson sample" in _error(capsys, base + ["--data", str(sample), "--epochs", "1"])
  assert "top-k preselection" in _error(capsys, base + ["--data", str(sample),
                                                        "--algorithm", "fest"])
  assert "trains one model per sample" in _error(capsys, base + ["--data", str(sample),
                                                                "--compare", "dpsgd,adafest"])
  assert "no manifest.json" in _error(capsys, base + ["--data", str(small_sample / "data")])
  missing = copy_sample(sample, tmp_path / "missing")
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
  edited = copy_sample(sample, tmp_path / "edited")
  manifest = json.loads((edited / "manifest.json").read_text())
  manifest.update(num_examples=2 * manifest["num_examples"],
                  sampling_rate=manifest["batch_size"] / (2 * manifest["num_examples"]))
  (edited / "manifest.json").write_text(json.dumps(manifest))
  assert "MAC does not match --seed-file" in _error(capsys, base + ["--data", str(edited)])


@pytest.mark.slow
@one_stack("tf2.21")  # trains until the changed shard is read
def test_a_changed_shard_stops_training_in_one_line(tmp_path, capsys, small_sample):
  changed = copy_sample(small_sample / "sample", tmp_path / "changed")
  shard = sorted(changed.glob("*.tfrecord"))[1]
  shard.write_bytes(shard.read_bytes()[:-1] + b"\0")
  # Each shard is checked as it is opened: the run stops at the changed one, in one line.
  assert main(_train_on_sample(small_sample, tmp_path) + ["--data", str(changed)]) == 2
  assert "sparse-dp train: error: sparse-dp: a sample shard does not match the manifest" in (
      capsys.readouterr().err.strip().splitlines()[-1])


@pytest.mark.slow
@one_stack("tf2.15")
def test_two_workers_train_on_a_sample_as_one_process(small_sample, tmp_path, capsys,
                                                     monkeypatch):
  """``train --reader batches --strategy multi-worker`` on two localhost workers: each step's
  batch is split between them, the chief alone claims the steps, and the model is the one
  a single process trains on the same batches (a fresh copy of the sample): this one, while
  the workers run (no third TensorFlow start)."""
  import tensorflow as tf

  from sparse_dp.jobs.sample import step_claims
  vocabulary = tmp_path / "vocabulary.json"
  Vocabulary.hashed([50] * 26).save(vocabulary)

  def train(sample: pathlib.Path, out: pathlib.Path, strategy: str) -> list[str]:
    return ["train", "--reader", "batches", "--data",
            str(copy_sample(small_sample / "sample", sample)),
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
  processes = [subprocess.Popen([sys.executable, "-m", "sparse_dp", *cluster], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                # Outside the checkout: its sparse_dp/ has no models/
                                # (installed as sparse_dp.models) and would shadow the package.
                                cwd=tmp_path, env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"})
               for env in environments]
  try:
    monkeypatch.delenv("TF_CONFIG", raising=False)
    capsys.readouterr()
    assert main(train(tmp_path / "alone_sample", tmp_path / "alone", "default")) == 0
    alone = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for process in processes:
      _, err = process.communicate(timeout=600)
      assert process.returncode == 0, err[-3000:]
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
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
  write_days(tmp_path / "data", [600, 400])
  seed_file = tmp_path / "secret" / "seed"
  seed_file.parent.mkdir()
  seed_file.write_bytes(SEED_BYTES)
  argv = ["sample", "--data", str(tmp_path / "data" / "day_*"), "--batch-size", "20",
          "--steps", "6", "--batches-per-shard", "2", "--seed-file", str(seed_file), "--json"]
  for name in "ab":
    assert main(argv + ["--out", str(tmp_path / name)]) == 0
  salts = [json.loads(line)["salt"] for line in capsys.readouterr().out.splitlines()]
  first, second = read_batches(tmp_path / "a"), read_batches(tmp_path / "b")
  # Two samples with one seed file: fresh salts, independent batches (each example is in
  # both batches of a step with probability q^2: 2.4 expected of 1000 x 6).
  assert len(set(salts)) == 2 and len(first) == len(second) == 6
  assert stats.binom.sf(shared_examples(first, second) - 1, 1000 * 6, 0.02**2) > ALPHA / 4
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
  copy = copy_sample(sample, tmp_path / "copy")
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
