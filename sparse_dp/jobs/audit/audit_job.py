"""One audited pCTR training run: canaries in, the job's training, scores, the bound.

The training is ``sparse-dp train``'s (``fitting.train_and_evaluate``: the same
preselection for DP-FEST / DP-AdaFEST+, ``make_private``, Poisson-sampled
batches, Adam, accountant), on the examples plus the included canaries, with
every table grown by the canaries' own rows. Its claimed epsilon is the job's
(training and preselection). The audit guesses from the training's iterates
(:mod:`sparse_dp.jobs.audit.scores`: white-box at every step, black-box from the
trained model) and tests the claim at ``delta`` (the job's: ``1 / N`` unless
given; the non-private run is audited at the same ``delta``). Each result
carries the audit's power (:mod:`sparse_dp.jobs.audit.power`) at its claim.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Optional

import numpy as np

from sparse_dp.accounting import PrivacyAccountant, effective_noise_multiplier
from sparse_dp.jobs.audit.canaries import Canaries
from sparse_dp.jobs.audit.exposure import exposure_summary
from sparse_dp.jobs.audit.one_run import audit, k_pairs
from sparse_dp.jobs.audit.power import IdealAudit
from sparse_dp.jobs.audit.scores import SCORES, WHITE_BOX, CanaryRows, StepAlignment, canary_scores
from sparse_dp.jobs.audit.testing import noise_scaled_for_testing
from sparse_dp.jobs.train.job_flags import FitSettings

POWER_RATE = 0.95
POWER_TRIALS = 1000


@dataclasses.dataclass(frozen=True)
class AuditFlags:
  """What ``fitting.train_and_evaluate`` reads of a job's flags."""

  epsilon: float
  selection_share: float
  fest_k: int


def audited_run(algorithm: str, flags: AuditFlags, settings: FitSettings, train, held_out,
                canaries: Canaries, beta: float, noise_scale: float = 1.0) -> dict:
  """Trains ``algorithm`` with ``canaries`` and audits it; the result as a JSON-ready dict.

  ``noise_scale < 1`` trains with that share of the noise while the accountant
  claims the configured epsilon (:func:`noise_scaled_for_testing`): a negative
  control, never a private run.
  """
  from sparse_dp.jobs.train import fitting
  broken = noise_scale != 1.0
  observers = []

  def observe(preselection):
    observers.append(StepAlignment(CanaryRows(canaries, train[0]["categorical"], preselection)))
    return observers

  with noise_scaled_for_testing(noise_scale) if broken else contextlib.nullcontext():
    fit, _ = fitting.train_and_evaluate(
        algorithm, settings, canaries.insert(train), held_out,
        canaries.model_vocabulary_sizes, fest_k=flags.fest_k,
        selection_share=flags.selection_share, observers=observe)
  metrics = fit.metrics
  alignment, = observers
  scores = canary_scores(fit.model, alignment.rows, alignment)
  delta = metrics["delta"] if metrics["delta"] is not None else (
      settings.delta if settings.delta is not None else 1.0 / metrics["train_examples"])
  result = audit(scores, canaries.included, delta, beta)
  best = result.best()
  included = canaries.included
  claim = metrics["epsilon"]
  return {
      "algorithm": algorithm,
      "mechanism": _mechanism(noise_scale),
      "noise_scale": noise_scale,
      "true_epsilon": (true_epsilon(metrics, noise_scale, min(settings.batch_size,
                                                             metrics["train_examples"]), delta)
                       if broken and claim is not None else claim),
      "private_run": claim is not None and not broken,
      "claimed_epsilon": claim, "delta": delta,
      "canaries": canaries.count, "canaries_included": int(included.sum()),
      "confidence": 1 - beta,
      "epsilon_lower_bound": best.epsilon_lower_bound,
      "flagged": claim is not None and best.epsilon_lower_bound > claim,
      "best": _guesses(best),
      "white_box": _guesses(max((result.best(s) for s in WHITE_BOX),
                                key=lambda g: g.epsilon_lower_bound)),
      "black_box": _guesses(result.best("loss")),
      "tries": len(result.tries),
      "power": audit_power(claim if claim is not None else flags.epsilon, canaries.count,
                           delta, beta),
      "exposure": {name: exposure_summary(scores[name], included) for name in SCORES},
      "rows_moved": {"included": _share(scores["row_movement"][included] > 0),
                     "excluded": _share(scores["row_movement"][~included] > 0)},
      "steps_observed": len(alignment.steps),
      "auc": metrics["auc"], "steps": metrics["steps"], "train_examples": metrics["train_examples"],
      "noise_multipliers": metrics["noise_multipliers"],
  }


@functools.lru_cache(maxsize=None)
def audit_power(claim: float, canaries: int, delta: float, beta: float) -> dict:
  """The smallest true epsilon this audit (its ``m``, tries and ``beta``) flags above
  ``claim`` in 95% of runs of the ideal mechanism (:class:`IdealAudit`)."""
  ideal = IdealAudit(claim, canaries, delta, beta, k_pairs(canaries), scores=len(SCORES),
                     trials=POWER_TRIALS)
  return {"claim": claim, "rate": POWER_RATE, "trials": POWER_TRIALS,
          "mechanism": "ideal: a Gaussian score per canary, exactly (epsilon, delta)-DP",
          "smallest_epsilon_flagged": ideal.smallest_flagged_epsilon(POWER_RATE)}


def true_epsilon(metrics: dict, noise_scale: float, batch_size: int,
                 delta: float) -> Optional[float]:
  """The accountant's epsilon for the noise a broken run really had (``None``: no noise,
  no bound): its steps at ``noise_scale`` x the noise multipliers, plus any preselection."""
  if noise_scale == 0:
    return None
  multipliers = {name: value * noise_scale for name, value in metrics["noise_multipliers"].items()}
  sigma = multipliers.get("sigma") or effective_noise_multiplier(multipliers["sigma1"],
                                                                  multipliers["sigma2"])
  accountant = PrivacyAccountant().step(sigma, batch_size / metrics["train_examples"],
                                        metrics["steps"])
  if metrics.get("selection_epsilon"):
    accountant.spend_pure(metrics["selection_epsilon"])
  return accountant.get_epsilon(delta)


def _mechanism(noise_scale: float) -> str:
  if noise_scale == 1.0:
    return "as configured"
  return "broken for testing: " + ("noise off" if noise_scale == 0 else f"noise x{noise_scale:g}")


def _guesses(guesses) -> dict:
  return {"score": guesses.score, "k_plus": guesses.k_plus, "k_minus": guesses.k_minus,
          "guesses": guesses.guesses, "correct": guesses.correct,
          "epsilon_lower_bound": guesses.epsilon_lower_bound}


def _share(flags: np.ndarray) -> Optional[float]:
  return float(flags.mean()) if flags.size else None
