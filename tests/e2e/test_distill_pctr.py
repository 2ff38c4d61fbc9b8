"""``sparse-dp distill --method dp-teacher / rona``: sizes, epsilon and refusals.

Each test runs tiny models on a few hundred synthetic examples.
"""

import json
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld

from sparse_dp.cli import main

from support.gaussian_composition import gaussians_epsilon
from support.stacks import one_stack

# Teacher: 96-unit tower on two tables; student: a tenth of the rows, 8-unit tower.
TINY = ["--categorical-features", "2", "--synthetic-scale", "0.01", "--max-examples", "300",
        "--max-public-examples", "300",
        "--hidden-units", "96,96", "--batch-size", "128", "--student-hidden-units", "8",
        "--student-rows", "0.1", "--student-epochs", "1", "--noise-seed", "3"]
# A loaded --teacher's tables and noise are fixed when it is trained.
TINY_TEACHER = TINY[2:-2]


def _count(model) -> int:
  return int(sum(np.prod(w.shape) for w in model.trainable_weights))


@pytest.fixture(scope="module")
def dp_teacher_folder(tmp_path_factory):
  """A DP teacher as 'sparse-dp train --noise-seed 1' writes it (model/, vocabulary.json,
  the keyed record of its training examples, metrics.json; the record's key in its own
  secrets folder), made cheaply: DP-SGD, two Poisson steps on the
  first 90% of the 300 synthetic day-1 examples TINY's --data reads (the trained-here
  DP-AdaFEST path costs minutes of tracing; benchmarks/results/distill/dp_teacher.json
  runs it)."""
  import sparse_dp
  from sparse_dp._keras import keras
  from sparse_dp.data import training_examples
  from sparse_dp.data.synthetic import SyntheticCriteo
  from sparse_dp.models.pctr import build_pctr_model
  from sparse_dp.models.pctr_data import CriteoSplit, hashed_vocabulary, model_inputs
  folder = tmp_path_factory.mktemp("teacher")
  vocabulary = hashed_vocabulary(0.01).leading(2)  # --synthetic-scale 0.01, two tables
  data = SyntheticCriteo(scale=0.01, seed=0).write_day(folder / "day_1.gz", 1, 300)
  split = CriteoSplit.read([data], 300, "error")
  x, y = model_inputs(split.train, vocabulary)
  model = build_pctr_model(vocabulary.sizes, (96, 96))
  model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True))
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig("dpsgd", noise_multiplier=1.5, noise_seed=1),
      num_examples=len(y), batch_size=135)
  model.fit(private.poisson_dataset(x, y, epochs=1.0), verbose=0)
  model.save(folder / "model")
  vocabulary.save(folder / "vocabulary.json")
  keys = tmp_path_factory.mktemp("keys")
  training_examples.save(split.train, folder, keys)
  (folder / "metrics.json").write_text(json.dumps({"noise_seed": 1}))
  return folder, private.epsilon(), keys


@pytest.mark.slow
@one_stack("tf2.15")
def test_dp_teacher_student_inherits_the_teachers_recorded_epsilon(dp_teacher_folder, tmp_path,
                                                                   capsys):
  from sparse_dp._keras import keras
  from sparse_dp.training.dp_state import dp_record
  folder, trained_epsilon, keys = dp_teacher_folder
  out, saved = tmp_path / "r.json", tmp_path / "models"
  # --noise-seed fixes nothing of a loaded teacher: refused.
  assert main(["distill", "--method", "dp-teacher", *TINY[2:], "--teacher", str(folder),
               "--secrets-dir", str(keys), "--out", str(out)]) == 2
  assert "drop --noise-seed" in capsys.readouterr().err
  assert main(["distill", "--method", "dp-teacher", *TINY_TEACHER, "--teacher", str(folder),
               "--secrets-dir", str(keys), "--save", str(saved), "--out", str(out)]) == 0
  report = json.loads(out.read_text())
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == report
  teacher = keras.models.load_model(folder / "model")
  student = keras.models.load_model(saved / "student" / "model")
  assert (report["teacher_parameters"], report["student_parameters"]) == (
      _count(teacher), _count(student))
  assert report["compression_ratio"] == pytest.approx(_count(teacher) / _count(student))
  assert report["compression_ratio"] > 5
  # The epsilon is the teacher's record, composed here straight from its weights.
  (record,) = {dp_record.decode(w.numpy()) for layer in teacher.layers
               for w in [getattr(layer, "dp_record", None)] if w is not None}
  events = [dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
      run.sampling_rate, dp_accounting.GaussianDpEvent(run.noise_multiplier)), steps)
            for run, steps in zip(record.runs, record.steps_by_run().values())]
  recorded = pld.PLDAccountant().compose(dp_accounting.ComposedDpEvent(events)).get_epsilon(
      record.runs[0].delta)
  assert record.steps_taken == 2 and recorded > 0
  assert report["epsilon"] == pytest.approx(recorded, rel=1e-6)
  assert report["epsilon"] == pytest.approx(trained_epsilon, rel=1e-6)
  assert report["delta"] == record.runs[0].delta
  assert report["adjacency"] == "add or remove one example"
  assert report["post_processing"] is True and "post-processing" in report["epsilon_covers"]
  assert report["distillation_inputs"]["saw_private_features"] is False
  assert "read with its key" in report["distillation_inputs"]["teacher_data_check"]
  # The teacher was trained with a fixed noise seed (its metrics.json): the caveat, at the top.
  assert list(report)[:2] == ["method", "caveats"]
  (caveat,) = report["caveats"]
  assert "fixed seed (1)" in caveat
  for key in ("teacher_auc", "student_auc", "auc_loss", "speedup", "command"):
    assert key in report, key


@pytest.mark.slow
@one_stack("tf2.15")
def test_rona_epsilon_is_the_composition_of_its_answered_batches(tmp_path, capsys):
  out = tmp_path / "rona.json"
  assert main(["distill", "--method", "rona", *TINY, "--query-share", "0.5",
               "--query-batch-size", "50", "--noise-multiplier", "40", "--rounds", "1",
               "--hint-clip", "2", "--logit-clip", "1", "--self-batch-size", "100",
               "--out", str(out)]) == 0
  report = json.loads(out.read_text())
  assert list(report)[:2] == ["method", "caveats"]
  (caveat,) = report["caveats"]
  assert "fixed seed (3)" in caveat and "answers" in caveat
  # The non-private teachers' training loss (un-noised private data) is never printed:
  # stdout is the report alone.
  assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [report]
  # N_q = 150 of 300 public samples: 3 batches of 50 per epoch, (T_h + R T_d) = 2 epochs.
  assert report["answered_batches"] == 6 and report["queries_per_epoch"] == 150
  assert report["mean_clip"] == {"hint": 2.0, "logit": 1.0}
  honest = gaussians_epsilon(40 / (2 * math.sqrt(50)), 6, report["delta"])
  assert report["epsilon"] == pytest.approx(honest, rel=1e-9)
  assert report["rona_claimed_epsilon"] == pytest.approx(
      gaussians_epsilon(40 / math.sqrt(50), 6, report["delta"]), rel=1e-9)
  assert report["rona_claimed_epsilon"] < report["epsilon"]
  assert report["compression_ratio"] > 5 and report["student_parameters"] > 0
  assert "teacher_auc" in report["not_covered_by_epsilon"]


def test_refusals(tmp_path, capsys):
  # The teacher's training data as distillation inputs (day 1 is --data synthetic).
  for method in ("dp-teacher", "rona"):
    assert main(["distill", "--method", method, *TINY, "--public-day", "1",
                 "--out", str(tmp_path / "r.json")]) == 2
    error = capsys.readouterr().err
    assert "270 of its 300 examples have the features of the teacher's private" in error
    assert ("--features-are-public" in error) == (method == "dp-teacher")
  assert main(["distill", "--method", "rona", *TINY, "--query-share", "0.01",
               "--out", str(tmp_path / "r.json")]) == 2
  assert "less than one batch" in capsys.readouterr().err
  assert main(["distill", "--method", "dp-teacher", "--out", str(tmp_path / "r.txt")]) == 2
  assert "--out must name a .json file" in capsys.readouterr().err
  assert main(["distill", "--method", "dp-teacher", *TINY_TEACHER, "--teacher", str(tmp_path),
               "--out", str(tmp_path / "r.json")]) == 2
  assert "is not a 'sparse-dp train' output folder" in capsys.readouterr().err
  assert not (tmp_path / "r.json").exists()


def test_declared_public_features_are_reported(tmp_path):
  from sparse_dp.cli import build_parser
  from sparse_dp.jobs.distill import pctr_inputs
  args = build_parser().parse_args(["distill", "--method", "dp-teacher", *TINY,
                                    "--public-day", "1", "--out", "x.json"])
  with pytest.raises(ValueError, match="private training examples"):
    pctr_inputs.load(args, tmp_path)
  data = pctr_inputs.load(args, tmp_path, features_are_public=True)
  assert data.saw_private_features is True and data.private_examples_in_public == 270
