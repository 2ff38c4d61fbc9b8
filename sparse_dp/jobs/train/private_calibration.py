"""``--calibration-share S``: private Platt scaling of the trained pCTR model, in the job's epsilon.

The job trains at ``(1 - S) epsilon`` (its noise calibrated to that), then fits
``p = sigmoid(a z + b)`` on the *training* examples' logits ``z`` with
:class:`sparse_dp.mechanisms.platt_scaling.PlattScaling`: ``T`` full-batch
Gaussian steps whose noise multiplier is the least that keeps the training's
events and the ``T`` steps, composed by one ``dp_accounting`` accountant, at
the job's ``epsilon`` and ``delta``
(:func:`sparse_dp.accounting.calibrate_after`). The calibration's epsilon is
not a separate budget: ``calibration_epsilon`` reports the total minus the
training's epsilon alone, what composing the steps added (about ``S epsilon``).

``(a, b)`` are folded into the model's output layer (``a > 0``: the ranking and
the AUC are unchanged), and the steps are written into the model's DP record
(``dp_record``) as a run ``"platt"`` of sampling rate 1, so the saved model's
epsilon, and any run warm-started from it, include them.
"""

from __future__ import annotations

import dataclasses
import secrets
from typing import Optional

import numpy as np

from sparse_dp.accounting import calibrate_after
from sparse_dp.mechanisms.platt_scaling import DEFAULT_STEPS, PlattMechanism, PlattScaling
from sparse_dp.models.calibration import calibration_metrics
from sparse_dp.training.dp_state.state import Run, attach
from sparse_dp.training.dp_state.weight_fingerprint import WeightsMovedOutsideDPError

PLATT_RUN = "platt"


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
            "platt_steps": self.mechanism.steps, "platt_logit_clip": self.mechanism.logit_clip}


def recalibrate(model, x_train, y_train, job_epsilon: float, delta: float,
                noise_seed: Optional[int]) -> Recalibration:
  """Fits and folds the private Platt scaling into ``model`` (trained by ``make_private``).

  ``len(y_train)`` is the training's public ``num_examples`` (its sampling rate's
  denominator). The noise is keyed by ``noise_seed`` (a secret one if ``None``).
  """
  state = attach(model)
  if state.weights_moved():
    raise WeightsMovedOutsideDPError(
        f"sparse-dp: the weights of model '{model.name}' moved outside its DP steps; no "
        "epsilon covers them, so they are not calibrated")
  spent = state.accountant()
  mechanism = PlattMechanism(calibrate_after(spent, job_epsilon, delta, DEFAULT_STEPS))
  logits = model.predict(x_train, batch_size=8192, verbose=0)
  seed = noise_seed if noise_seed is not None else secrets.randbits(62)
  scaling = PlattScaling.fit(logits, y_train, mechanism, len(y_train), seed)
  scaling.fold_into(model.get_layer("logit"))
  state.record_release(Run(algorithm=PLATT_RUN, noise_multiplier=mechanism.noise_multiplier,
                           sampling_rate=1.0, first_step=0, num_examples=len(y_train),
                           delta=delta), mechanism.steps)
  state.rebind()  # the record describes the calibrated weights
  epsilon = state.accountant().get_epsilon(delta)
  return Recalibration(scaling, mechanism, epsilon, epsilon - spent.get_epsilon(delta))


def held_out_metrics(model, held_out) -> tuple[dict, object]:
  """The calibration metrics (:func:`calibration_metrics`) of ``model`` on ``held_out``."""
  x_eval, y_eval = held_out
  return calibration_metrics(np.asarray(model.predict(x_eval, batch_size=8192, verbose=0)),
                             y_eval)
