"""The job's progress bar: the epsilon spent so far, as logged, not a mean over the epoch."""

import re

import sparse_dp
from sparse_dp.jobs.train import fitting

from support.keras_models import N, functional_model, synthetic_data


def test_the_bar_shows_the_epsilon_logged_not_its_mean_over_the_steps(capsys):
  model = functional_model()
  private = sparse_dp.make_private(
      model, sparse_dp.DPConfig("dpsgd", noise_multiplier=1.0, noise_seed=1),
      num_examples=N, batch_size=256)
  ids, labels = synthetic_data()
  capsys.readouterr()
  model.fit(private.poisson_dataset(ids, labels, epochs=0.5), verbose=1,
            callbacks=[private.callback(log_every_steps=3), fitting._progress_bar()])
  shown = re.findall(r"epsilon: ([0-9.]+)", capsys.readouterr().out)
  # The last bar is the epoch's: its exact epsilon, where a mean of the steps' would be less.
  assert shown and float(shown[-1]) == round(float(private.epsilon()), 4)
