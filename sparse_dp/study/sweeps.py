"""The pCTR sweeps of Ghazi et al. (NeurIPS 2023) §4.2 and App. D.2.2 on one data set.

* :func:`tradeoffs` (Fig. 3, Fig. 8): DP-SGD, DP-FEST over ``k``, DP-AdaFEST
  over ``tau``, DP-AdaFEST+ over ``(k, tau)`` at one epsilon, with the
  non-private model for reference, and the best gradient-size reduction each
  algorithm reaches within an AUC loss of DP-SGD's.
* :func:`epsilon_sweep` (Fig. 4): each algorithm's default point at every epsilon.
* :func:`heatmap` (Fig. 7, Fig. 9): DP-AdaFEST over ``sigma1/sigma2 x tau``.

Every point is trained over the preset's seeds (:class:`sparse_dp.study.runs.Runner`).
"""

from __future__ import annotations

import pathlib
from typing import Optional, Sequence

from sparse_dp.study.inputs import StudyInputs
from sparse_dp.study.presets import StudyPreset
from sparse_dp.study.runs import Point, Runner

# AUC losses relative to DP-SGD at which Fig. 3 reads the best reduction.
AUC_LOSS_THRESHOLDS = (0.001, 0.005, 0.01, 0.02, 0.05)


def runner(preset: StudyPreset, data: str, out: pathlib.Path) -> Runner:
  inputs = StudyInputs.load(data, preset.examples, preset.synthetic_scale, preset.features,
                            pathlib.Path(out) / "data", max_examples=preset.max_examples)
  return Runner(inputs, preset, out)


def default_point(algorithm: str, epsilon: float, preset: StudyPreset) -> Point:
  """An algorithm's point with the first value of each of its sweeps."""
  k, tau = preset.adafest_plus[0] if algorithm == "adafest+" else (preset.fest_ks[0],
                                                                    preset.tau_sigmas[0])
  return Point(algorithm, epsilon,
               fest_k=k if algorithm in ("fest", "adafest+") else None,
               tau_sigmas=tau if algorithm in ("adafest", "adafest+") else None,
               sigma_ratio=(preset.sigma_ratios[0] if algorithm in ("adafest", "adafest+")
                            else None))


def _report(study: str, runs: Runner, points: list[dict], **extra) -> dict:
  return {"study": study, "preset": runs.preset.describe(), "source": runs.inputs.source,
          "table_rows": runs.inputs.rows, "points": points, **extra}


def tradeoffs(preset: StudyPreset, data: str, out: pathlib.Path,
              points: Optional[Sequence[Point]] = None) -> dict:
  """``points`` (a grid's, :mod:`sparse_dp.study.grid`; default: the preset's sweep)
  over the preset's seeds, and the best reduction of each algorithm within an AUC loss
  of the one DP-SGD point's AUC."""
  if points is None:
    eps, ratio = preset.epsilon, preset.sigma_ratios[0]
    points = [Point("none", None), Point("dpsgd", eps)]
    points += [Point("fest", eps, fest_k=k) for k in preset.fest_ks]
    points += [Point("adafest", eps, tau_sigmas=t, sigma_ratio=ratio)
               for t in preset.tau_sigmas]
    points += [Point("adafest+", eps, fest_k=k, tau_sigmas=t, sigma_ratio=ratio)
               for k, t in preset.adafest_plus]
  baselines = [p for p in points if p.algorithm == "dpsgd"]
  if len(baselines) != 1:
    raise ValueError(f"the tradeoffs study compares every point with one DP-SGD point; "
                     f"give exactly one (got {[p.label for p in baselines]})")
  runs = runner(preset, data, out)
  summaries = [runs.summary(p) for p in points]
  return _report("tradeoffs", runs, summaries, epsilon=baselines[0].epsilon,
                 best_reduction=best_reduction(summaries, AUC_LOSS_THRESHOLDS))


def best_reduction(points: list[dict], thresholds) -> list[dict]:
  """Per private algorithm and AUC-loss threshold ``t``: its point of largest mean
  gradient-size reduction among those with mean AUC >= DP-SGD's - ``t`` (Fig. 3)."""
  (baseline,) = [p for p in points if p["algorithm"] == "dpsgd"]
  rows = []
  for algorithm in dict.fromkeys(p["algorithm"] for p in points):
    if algorithm in ("none", "dpsgd"):
      continue
    for threshold in thresholds:
      within = [p for p in points if p["algorithm"] == algorithm
                and p["auc_mean"] >= baseline["auc_mean"] - threshold]
      best = max(within, key=lambda p: p["gradient_size_reduction"], default=None)
      rows.append({"algorithm": algorithm, "auc_loss_threshold": threshold,
                   "label": best and best["label"],
                   **{key: best and best[key] for key in (
                       "gradient_size_reduction", "auc_mean", "auc_std", "epsilon_spent")}})
  return rows


def epsilon_sweep(preset: StudyPreset, data: str, out: pathlib.Path) -> dict:
  runs = runner(preset, data, out)
  points = [runs.summary(default_point(a, e, preset))
            for e in preset.epsilons for a in preset.epsilon_algorithms]
  return _report("epsilon", runs, points, epsilons=list(preset.epsilons))


def heatmap(preset: StudyPreset, data: str, out: pathlib.Path) -> dict:
  runs = runner(preset, data, out)
  points = [runs.summary(Point("adafest", preset.epsilon, tau_sigmas=t, sigma_ratio=r))
            for r in preset.sigma_ratios for t in preset.tau_sigmas]
  return _report("heatmap", runs, points, epsilon=preset.epsilon,
                 sigma_ratios=list(preset.sigma_ratios), tau_sigmas=list(preset.tau_sigmas))
