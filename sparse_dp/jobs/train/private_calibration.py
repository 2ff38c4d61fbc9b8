"""``--calibration-share S``: private Platt scaling of the trained pCTR model, in the job's epsilon.

The job trains at ``(1 - S) epsilon`` (its noise calibrated to that), then fits
``p = sigmoid(a z + b)`` with :class:`sparse_dp.mechanisms.platt_scaling.PlattScaling` on
the logits ``z`` of a Poisson sample of the *training* examples, of rate
``q = min(1, CALIBRATION_EXAMPLES / N)``: ``T`` Gaussian steps whose noise multiplier is the
least that keeps the training's events and the sample's release, composed by one
``dp_accounting`` accountant, at the job's ``epsilon`` and ``delta``
(:func:`sparse_dp.accounting.calibrate_after`). ``calibration_epsilon`` reports the total
minus the training's epsilon alone (about ``S epsilon``).

``(a, b)`` are folded into the model's output layer (``a > 0``: the ranking and the AUC
are unchanged), and the release is written into the model's DP record (``dp_record``) as a
run ``"platt"`` of one step (the ``T`` steps' one Gaussian, of rate ``q``), so the saved
model's epsilon, and any run warm-started from it, include it.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Optional

import numpy as np
import tensorflow as tf

from sparse_dp.accounting import calibrate_after, release_noise_multiplier
from sparse_dp.mechanisms import bernoulli_positions
from sparse_dp.mechanisms.platt_scaling import DEFAULT_STEPS, PlattMechanism, PlattScaling
from sparse_dp.models.calibration import calibration_metrics
from sparse_dp.training.dp_state.state import Run, attach
from sparse_dp.training.dp_state.weight_fingerprint import WeightsMovedOutsideDPError

PLATT_RUN = "platt"
# The expected size of the Poisson sample the fit reads: its prediction pass and its steps
# cost O(sample), not O(N). At the default job's epsilon the noise on the mean gradient,
# sigma C / (q N), is about what the whole 360,000 gave (docs/calibration.md).
CALIBRATION_EXAMPLES = 65_536
# The sample is keyed (noise_seed, SAMPLE_STREAM), away from the noise's keys.
SAMPLE_STREAM = 2 ** 47


# The default share of a DP run of `sparse-dp train` where the job can calibrate: 0.05
# gave the same log-loss as 0.1 on the default job (docs/calibration.md).
DEFAULT_SHARE = 0.05


def job_share(requested: Optional[float], private: bool, reader: str, strategy: str) -> float:
  """``--calibration-share`` as given, else its default: ``DEFAULT_SHARE`` of a DP run
  whose training examples are in memory in one process (``--reader pandas``, no
  cluster strategy), 0 for the others (non-private, streamed or sampled examples,
  clusters), which are left uncalibrated."""
  if requested is not None:
    check_share(requested)
    return requested
  in_memory = reader == "pandas" and strategy == "default"
  return DEFAULT_SHARE if private and in_memory else 0.0


def check_share(share: float) -> None:
  """Refuses a ``--calibration-share`` outside ``[0, 1)``."""
  if not 0 <= share < 1:
    raise ValueError(f"--calibration-share must be in [0, 1) (the share of --epsilon spent on "
                     f"the private Platt scaling; 0: off), got {share}")


def training_epsilon(job_epsilon: float, share: float) -> float:
  """The epsilon the training is calibrated to: ``(1 - share) job_epsilon``."""
  check_share(share)
  return (1.0 - share) * job_epsilon


@dataclasses.dataclass(frozen=True)
class Recalibration:
  """The fitted map and what it cost."""

  scaling: PlattScaling
  mechanism: PlattMechanism
  epsilon: float  # the job's, calibration included
  calibration_epsilon: float  # epsilon minus the training's alone

  def metrics(self) -> dict:
    return {"epsilon": self.epsilon, "calibration_epsilon": self.calibration_epsilon,
            "platt_a": self.scaling.slope, "platt_b": self.scaling.intercept,
            "platt_noise_multiplier": self.mechanism.noise_multiplier,
            "platt_steps": self.mechanism.steps, "platt_logit_clip": self.mechanism.logit_clip,
            "platt_sampling_rate": self.mechanism.sampling_rate}


def recalibrate(model, x_train, y_train, job_epsilon: float, delta: float,
                noise_seed: Optional[int], features=lambda x: x) -> Recalibration:
  """Fits and folds the private Platt scaling into ``model`` (trained by ``make_private``).

  Args:
    model: the trained model, with its DP record and an output layer named ``logit``.
    x_train: the training examples' features (a nest of arrays), all ``N`` of them.
    y_train: their labels; ``N = len(y_train)`` is the training's public ``num_examples``.
    job_epsilon: the job's epsilon, the training's included.
    delta: the job's delta.
    noise_seed: keys the sample and the noise; ``None``: a secret one.
    features: maps the sample's features to the model's inputs (e.g. the kept buckets).

  Returns:
    The fitted map and the epsilon with it.

  Raises:
    WeightsMovedOutsideDPError: the model's weights moved outside its DP steps.
  """
  state = attach(model)
  if state.weights_moved():
    raise WeightsMovedOutsideDPError(
        f"sparse-dp: the weights of model '{model.name}' moved outside its DP steps; no "
        "epsilon covers them, so they are not calibrated")
  spent = state.accountant()
  num_examples = len(y_train)
  rate = min(1.0, CALIBRATION_EXAMPLES / num_examples)
  mechanism = PlattMechanism(calibrate_after(spent, job_epsilon, delta, DEFAULT_STEPS, rate),
                             sampling_rate=rate)
  seed = noise_seed if noise_seed is not None else secrets.randbits(62)
  sample = bernoulli_positions(num_examples, rate, tf.constant([seed, SAMPLE_STREAM], tf.int64))
  sample = sample.numpy()
  x_sample = tf.nest.map_structure(lambda column: np.asarray(column)[sample], x_train)
  logits = model.predict(features(x_sample), batch_size=8192, verbose=0)
  scaling = PlattScaling.fit(logits, np.asarray(y_train)[sample], mechanism,
                             rate * num_examples, seed)
  scaling.fold_into(model.get_layer("logit"))
  release = release_noise_multiplier(mechanism.noise_multiplier, mechanism.steps)
  state.record_release(Run(algorithm=PLATT_RUN, noise_multiplier=release, sampling_rate=rate,
                           first_step=0, num_examples=num_examples, delta=delta), 1)
  state.rebind()  # the record describes the calibrated weights
  epsilon = state.accountant().get_epsilon(delta)
  return Recalibration(scaling, mechanism, epsilon, epsilon - spent.get_epsilon(delta))


def held_out_metrics(model, held_out) -> tuple[dict, object]:
  """The calibration metrics (:func:`calibration_metrics`) of ``model`` on ``held_out``."""
  x_eval, y_eval = held_out
  return calibration_metrics(np.asarray(model.predict(x_eval, batch_size=8192, verbose=0)),
                             y_eval)
