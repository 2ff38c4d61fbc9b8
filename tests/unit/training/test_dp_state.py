"""The DP state lasts: checkpoints carry it, a resumed or second run continues the budget."""

import functools
import pathlib
import subprocess
import sys

import dp_accounting
import numpy as np
import pytest
import tensorflow as tf
from dp_accounting import pld

import sparse_dp
from sparse_dp import keras

from support.keras_models import N, functional_model, synthetic_data

BATCH = 256  # q = 1/16: 16 steps per epoch


def make_private(model, sigma=2.0, budget=1.0, **options):
  config = sparse_dp.DPConfig("dpsgd", noise_multiplier=sigma, epsilon_budget=budget)
  return sparse_dp.make_private(model, config, num_examples=N, batch_size=BATCH, **options)


def train(model, private, epochs, callbacks=()):
  ids, labels = synthetic_data()
  model.fit(private.poisson_dataset(ids, labels, epochs=epochs), verbose=0,
            callbacks=[private.callback(), *callbacks])


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
  """A run stopped after one epoch, saved by ModelCheckpoint, model.save and tf.train.Checkpoint."""
  folder = tmp_path_factory.mktemp("interrupted")
  model = functional_model(optimizer=keras.optimizers.Adam(0.01))
  private = make_private(model)
  saver = keras.callbacks.ModelCheckpoint(str(folder / "weights"), save_weights_only=True)
  train(model, private, epochs=1, callbacks=[saver])
  model.save(folder / "saved_model")
  tf.train.Checkpoint(model=model).save(folder / "checkpoints" / "ckpt")
  return folder, private, model


def test_resumed_run_continues_steps_and_stops_at_the_same_total(interrupted):
  folder, before, _ = interrupted
  assert int(before.steps_taken.numpy()) == 16
  whole = functional_model()
  whole_run = make_private(whole)
  train(whole, whole_run, epochs=10)
  total = int(whole_run.steps_taken.numpy())
  assert 16 < total < 160  # the budget, not the data, stopped it

  resumed_model = functional_model()
  resumed = make_private(resumed_model, resume_from=str(folder / "weights"))
  assert int(resumed.steps_taken.numpy()) == 16
  assert resumed.epsilon() == pytest.approx(before.epsilon())
  train(resumed_model, resumed, epochs=10)
  assert int(resumed.steps_taken.numpy()) == total
  assert resumed.epsilon() == pytest.approx(whole_run.epsilon())
  assert resumed.epsilon() <= 1.0 < resumed.epsilon(total + 1)


@pytest.mark.parametrize("saved", ["weights", "saved_model", "checkpoints"])
def test_every_checkpoint_format_holds_the_state(interrupted, saved):
  folder, before, _ = interrupted
  resumed = make_private(functional_model(), resume_from=str(folder / saved))
  assert int(resumed.steps_taken.numpy()) == 16 and resumed.poisson_sampling
  assert resumed.epsilon() == pytest.approx(before.epsilon())
  assert resumed.report().earlier_steps == 16


def test_restored_weights_carry_the_state_before_or_after_make_private(interrupted):
  folder, before, _ = interrupted
  loaded_first = functional_model()
  loaded_first.load_weights(str(folder / "weights"))
  assert int(make_private(loaded_first).steps_taken.numpy()) == 16
  loaded_after = functional_model()
  private = make_private(loaded_after)
  loaded_after.load_weights(str(folder / "weights"))  # replaces the state make_private wrote
  assert private.epsilon() == pytest.approx(before.epsilon())
  assert int(private.accountant.steps) == 16 and private.report().earlier_steps == 16


def test_checkpoint_without_state_is_refused_clearly(tmp_path):
  plain = functional_model()
  plain.save_weights(str(tmp_path / "plain"))
  with pytest.raises(ValueError, match="no sparse-dp DP state"):
    make_private(functional_model(), resume_from=str(tmp_path / "plain"))
  with pytest.raises(ValueError, match="TF format"):
    make_private(functional_model(), resume_from=str(tmp_path / "weights.h5"))


def test_second_make_private_on_a_model_composes_both_runs():
  model = functional_model()
  first = make_private(model, sigma=1.0, budget=None)
  train(model, first, epochs=0.5)
  spent = first.epsilon()
  second = make_private(model, sigma=2.0, budget=None)
  assert second.epsilon() == pytest.approx(spent)  # not zero
  train(model, second, epochs=0.5)
  accountant = pld.PLDAccountant()
  for sigma in (1.0, 2.0):
    accountant.compose(dp_accounting.PoissonSampledDpEvent(
        BATCH / N, dp_accounting.GaussianDpEvent(sigma)), 8)
  assert second.epsilon() == pytest.approx(accountant.get_epsilon(1 / N), rel=1e-3)
  assert second.report().earlier_steps == 8 and second.report().to_dict()["steps"] == 8


def test_saved_files_hold_no_noise_seed(interrupted):
  folder, private, _ = interrupted
  seed = private.seed  # drawn from the OS: no noise_seed given
  needles = [int(seed).to_bytes(8, "little"), int(seed).to_bytes(8, "big"), str(seed).encode()]
  files = [f for f in folder.rglob("*") if f.is_file()]
  assert len(files) > 5
  for path in files:
    content = path.read_bytes()
    assert not any(needle in content for needle in needles), path


@pytest.mark.slow
def test_load_model_after_import_sparse_dp_alone(interrupted):
  folder, _, _ = interrupted
  script = (
      "import sys, sparse_dp, tensorflow\n"
      "from sparse_dp import keras\n"
      f"model = keras.models.load_model({str(folder / 'saved_model')!r})\n"
      "private = sparse_dp.make_private(model, sparse_dp.DPConfig('dpsgd', noise_multiplier=2.0),"
      f" num_examples={N}, batch_size={BATCH})\n"
      "print(type(model.optimizer).__name__, int(private.steps_taken.numpy()))\n")
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=300, cwd=pathlib.Path(__file__).parent)
  assert done.returncode == 0, done.stderr[-3000:]
  assert done.stdout.split()[-2:] == ["LazyAdam", "16"]


@pytest.mark.slow
def test_privacy_calculator_does_not_load_tensorflow(tmp_path):
  script = "import sys, sparse_dp, sparse_dp.cli; print('tensorflow' in sys.modules)"
  # Outside the checkout: the installed package, with sparse_dp.models mapped in.
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=300, cwd=tmp_path)
  assert done.returncode == 0 and done.stdout.split() == ["False"], done.stderr[-3000:]


def test_resumed_preselection_is_charged_once_and_a_new_run_charges_its_own(tmp_path):
  config = sparse_dp.DPConfig("fest", noise_multiplier=2.0, selection_epsilon=0.5)
  model = functional_model()
  first = sparse_dp.make_private(model, config, num_examples=N, batch_size=BATCH)
  model.save_weights(str(tmp_path / "fest"))
  assert first.epsilon() == pytest.approx(0.5)
  resumed = sparse_dp.make_private(functional_model(), config, num_examples=N, batch_size=BATCH,
                                   resume_from=str(tmp_path / "fest"))
  assert resumed.epsilon() == pytest.approx(0.5)
  again = sparse_dp.make_private(model, config, num_examples=N, batch_size=BATCH)
  assert again.epsilon() == pytest.approx(1.0)  # no resume_from: a new selection


def test_a_rollback_in_the_same_process_never_reuses_noise(tmp_path):
  """Two updates from one restored checkpoint on the same batch must differ by fresh noise."""
  model = functional_model()
  private = sparse_dp.make_private(model, sparse_dp.DPConfig("dpsgd", noise_multiplier=5.0),
                                   num_examples=N, batch_size=128)
  ids, labels = synthetic_data()
  model.save_weights(str(tmp_path / "ckpt"))
  updates = []
  for _ in range(2):
    model.load_weights(str(tmp_path / "ckpt"))
    before = [v.numpy() for v in model.trainable_variables]
    model.train_on_batch(ids[:128], labels[:128])
    updates.append([v.numpy() - b for v, b in zip(model.trainable_variables, before)])
  difference = np.sqrt(sum(np.sum((a - b) ** 2) for a, b in zip(*updates)))
  size = np.sqrt(sum(np.sum(a ** 2) for a in updates[0]))
  assert difference > 0.5 * size  # same data, independent noise: not the same update
  assert private.accountant.steps >= 1


@functools.lru_cache(maxsize=None)
def epsilon_of(steps, sigma=2.0):
  """An independent dp_accounting epsilon of ``steps`` Poisson-subsampled Gaussian steps (a
  float, kept: each PLD takes about a second, and several tests ask for the same steps)."""
  accountant = pld.PLDAccountant()
  accountant.compose(dp_accounting.PoissonSampledDpEvent(
      BATCH / N, dp_accounting.GaussianDpEvent(sigma)), steps)
  return accountant.get_epsilon(1 / N)


def restore_h5(model, folder):
  model.save_weights(str(folder / "w.h5"))
  fresh = functional_model()
  fresh.load_weights(str(folder / "w.h5"))
  return fresh


def restore_keras(model, folder):
  model.save(str(folder / "m.keras"))
  return keras.models.load_model(str(folder / "m.keras"))


def restore_set_weights(model, _):
  fresh = functional_model()
  fresh.set_weights(model.get_weights())
  return fresh


@pytest.mark.parametrize("restore", [restore_h5, restore_keras, restore_set_weights])
def test_weights_restored_by_any_keras_path_carry_the_budget(interrupted, tmp_path, restore):
  _, before, model = interrupted  # made private and trained one epoch (16 steps)
  restored = restore(model, tmp_path)
  again = make_private(restored, budget=None)
  assert int(again.steps_taken.numpy()) == 16 and again.poisson_sampling
  assert again.epsilon() == pytest.approx(before.epsilon())
  assert again.epsilon() == pytest.approx(epsilon_of(16), rel=1e-3)


def test_a_model_built_on_trained_layers_starts_from_their_spend():
  first = functional_model()
  private = make_private(first, budget=None)
  train(first, private, epochs=1)
  ids = keras.Input(shape=(), dtype=tf.int64)
  shared_table = first.get_layer("ids")
  second = keras.Model(ids, keras.layers.Dense(1)(shared_table(ids)))
  second.compile(optimizer=keras.optimizers.legacy.SGD(0.5),
                 loss=keras.losses.BinaryCrossentropy(from_logits=True))
  on_shared = make_private(second, budget=None)
  assert on_shared.epsilon() == pytest.approx(epsilon_of(16), rel=1e-3)  # not zero
  train(second, on_shared, epochs=1)
  assert on_shared.epsilon() == pytest.approx(epsilon_of(32), rel=1e-3)


def test_a_rollback_is_charged_every_step_run(tmp_path):
  """32 steps, back to the checkpoint at 16, 16 more: 48 releases of the data."""
  model = functional_model()
  private = make_private(model, budget=None)
  train(model, private, epochs=1)
  model.save_weights(str(tmp_path / "at16"))
  train(model, private, epochs=1)
  model.load_weights(str(tmp_path / "at16"))
  assert int(private.steps_taken.numpy()) == 32  # not the checkpoint's 16: every step run
  train(model, private, epochs=1)
  assert private.epsilon() == pytest.approx(epsilon_of(48), rel=1e-3)
  assert int(private.steps_taken.numpy()) == 48  # read again, the counter never goes back
  restored = functional_model()
  restored.load_weights(str(tmp_path / "at16"))
  assert make_private(restored, budget=None).epsilon() == pytest.approx(epsilon_of(48), rel=1e-3)


def test_a_checkpoint_with_more_steps_from_another_job_is_charged_once(tmp_path):
  """16 steps here; another job resumes them to 48; loading it and 16 more is 64 steps."""
  model = functional_model()
  private = make_private(model, budget=None)
  train(model, private, epochs=1)
  model.save_weights(str(tmp_path / "here"))
  other_model = functional_model()
  other = make_private(other_model, budget=None, resume_from=str(tmp_path / "here"))
  other_model.load_weights(str(tmp_path / "here"))
  train(other_model, other, epochs=2)
  other_model.save_weights(str(tmp_path / "there.h5"))
  model.load_weights(str(tmp_path / "there.h5"))
  train(model, private, epochs=1)
  assert private.epsilon() == pytest.approx(epsilon_of(64), rel=1e-3)
