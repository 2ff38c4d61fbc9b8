"""``sparse-dp distill --method dp-teacher / rona``: sizes, epsilon and refusals.

Each test runs tiny models on a few hundred synthetic examples; statistical
tests fail a correct implementation with probability at most conftest.ALPHA.
"""

import json
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld
from scipy import stats

from sparse_dp.cli import main
from sparse_dp.jobs.distill import dp_teacher
from sparse_dp.jobs.distill.rona import privacy as rona_privacy
from sparse_dp.jobs.distill.rona.answers import NoisyAnswers, clip_rows
from sparse_dp.jobs.distill.rona.query_selection import bernoulli_kl, select_queries

from support.stacks import ALPHA, one_stack

# Teacher: 96-unit tower on two tables; student: a tenth of the rows, 8-unit tower.
TINY = ["--categorical-features", "2", "--synthetic-scale", "0.01", "--max-examples", "300",
        "--max-public-examples", "300",
        "--hidden-units", "96,96", "--batch-size", "128", "--student-hidden-units", "8",
        "--student-rows", "0.1", "--student-epochs", "1", "--noise-seed", "3"]
# A loaded --teacher's tables and noise are fixed when it is trained.
TINY_TEACHER = TINY[2:-2]


def _count(model) -> int:
  return int(sum(np.prod(w.shape) for w in model.trainable_weights))


def _gaussians_epsilon(multiplier: float, count: int, delta: float) -> float:
  event = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(multiplier), count)
  return pld.PLDAccountant().compose(event).get_epsilon(delta)


@pytest.fixture(scope="module")
def dp_teacher_folder(tmp_path_factory):
  """A DP teacher as 'sparse-dp train --noise-seed 1' writes it (model/, vocabulary.json,
  training_examples.npy, metrics.json), made cheaply: DP-SGD, two Poisson steps on the
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
  training_examples.save(split.train, folder)
  (folder / "metrics.json").write_text(json.dumps({"noise_seed": 1}))
  return folder, private.epsilon()


@pytest.mark.slow
@one_stack("tf2.15")
def test_dp_teacher_student_inherits_the_teachers_recorded_epsilon(dp_teacher_folder, tmp_path,
                                                                   capsys):
  from sparse_dp._keras import keras
  from sparse_dp.training.dp_state import dp_record
  folder, trained_epsilon = dp_teacher_folder
  out, saved = tmp_path / "r.json", tmp_path / "models"
  # --noise-seed fixes nothing of a loaded teacher: refused.
  assert main(["distill", "--method", "dp-teacher", *TINY[2:], "--teacher", str(folder),
               "--out", str(out)]) == 2
  assert "drop --noise-seed" in capsys.readouterr().err
  assert main(["distill", "--method", "dp-teacher", *TINY_TEACHER, "--teacher", str(folder),
               "--save", str(saved), "--out", str(out)]) == 0
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
  honest = _gaussians_epsilon(40 / (2 * math.sqrt(50)), 6, report["delta"])
  assert report["epsilon"] == pytest.approx(honest, rel=1e-9)
  assert report["rona_claimed_epsilon"] == pytest.approx(
      _gaussians_epsilon(40 / math.sqrt(50), 6, report["delta"]), rel=1e-9)
  assert report["rona_claimed_epsilon"] < report["epsilon"]
  assert report["compression_ratio"] > 5 and report["student_parameters"] > 0
  assert "teacher_auc" in report["not_covered_by_epsilon"]


def test_rona_epsilon_grows_with_the_queries():
  class Args:  # the flags RonaSchedule reads
    query_batch_size, hint_epochs, rounds, distill_epochs, self_epochs = 50, 1, 2, 1, 1
  few, more = Args(), Args()
  few.query_share, more.query_share = 0.5, 1.0
  schedules = [rona_privacy.RonaSchedule.from_args(a, 300) for a in (few, more)]
  assert [s.answered_batches for s in schedules] == [9, 18]
  epsilons = [rona_privacy.rona_epsilon(40.0, [50] * s.answered_batches, 1e-5)
              for s in schedules]
  assert epsilons[0] == pytest.approx(_gaussians_epsilon(40 / (2 * math.sqrt(50)), 9, 1e-5))
  assert epsilons[1] == pytest.approx(_gaussians_epsilon(40 / (2 * math.sqrt(50)), 18, 1e-5))
  assert epsilons[1] > 1.2 * epsilons[0]
  sigma = rona_privacy.calibrate_sigma(3.0, 1e-5, 50, 18)
  assert 2.95 < rona_privacy.rona_epsilon(sigma, [50] * 18, 1e-5) <= 3.0


def test_teacher_answers_are_clipped_and_noised_at_sigma_c():
  """The noise is N(0, (sigma C)^2) per coordinate, independent of the answers."""
  rng = np.random.default_rng(0)
  values = rng.normal(0, 5, (400, 50))  # norms ~35, far above the clip
  sigma, clip = 3.0, 2.0
  answers = NoisyAnswers(sigma, noise_seed=11)
  noisy = answers.answer(values, clip)
  clipped = clip_rows(values, clip)
  assert np.allclose(np.linalg.norm(clipped, axis=1), clip)
  small = rng.normal(0, 0.01, (4, 50))
  assert np.array_equal(clip_rows(small, clip), small)
  standardized = ((noisy - clipped) / (sigma * clip)).ravel()  # 20,000 draws
  # Two-sided tests, each at ALPHA / 2: the variance (chi-square) and the shape (KS).
  chi2 = float(np.sum(standardized ** 2))
  n = standardized.size
  assert stats.chi2.ppf(ALPHA / 4, n) < chi2 < stats.chi2.ppf(1 - ALPHA / 4, n)
  assert stats.kstest(standardized, "norm").pvalue > ALPHA / 2
  assert answers.batch_sizes == [400] and answers.clips == [clip]
  # A noise 10% too small fails the variance test (its power at this size is ~1).
  assert np.sum((standardized * 0.9) ** 2) < stats.chi2.ppf(ALPHA / 4, n)


def test_query_selection_is_algorithm_3():
  """Greedy farthest-point by KL of the student's outputs, as a direct O(N^2) reading."""
  p = np.random.default_rng(1).beta(2, 5, 60)
  chosen = select_queries(p, 12, np.random.default_rng(7))
  order = np.random.default_rng(7).permutation(60)
  expected = [order[0]]
  for _ in range(11):
    rest = [i for i in order if i not in expected]
    expected.append(max(rest, key=lambda i: min(bernoulli_kl(p[i:i + 1], p[j])[0]
                                                for j in expected)))
  assert list(chosen) == expected
  assert np.argmin(p) in chosen and np.argmax(p) in chosen


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


def test_a_teacher_without_dp_record_is_refused():
  from sparse_dp.models.pctr import build_pctr_model
  with pytest.raises(ValueError, match="the teacher has no DP record"):
    dp_teacher.teacher_privacy(build_pctr_model([5] * 26, (4,)))


def test_declared_public_features_are_reported(tmp_path):
  from sparse_dp.cli import build_parser
  from sparse_dp.jobs.distill import pctr_inputs
  args = build_parser().parse_args(["distill", "--method", "dp-teacher", *TINY,
                                    "--public-day", "1", "--out", "x.json"])
  with pytest.raises(ValueError, match="private training examples"):
    pctr_inputs.load(args, tmp_path)
  data = pctr_inputs.load(args, tmp_path, features_are_public=True)
  assert data.saw_private_features is True and data.private_examples_in_public == 270
