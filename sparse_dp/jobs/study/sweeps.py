"""The pCTR sweeps of Ghazi et al. (NeurIPS 2023) §4.2 and App. D.2.2 on one data set.

* :func:`tradeoffs` (Fig. 3, Fig. 8): DP-SGD, DP-FEST over ``k``, DP-AdaFEST over ``tau``,
  DP-AdaFEST+ over ``(k, tau)`` at one epsilon, with the non-private model for reference, and
  the best gradient-size reduction each algorithm reaches within an AUC loss of DP-SGD's.
* :func:`epsilon_sweep` (Fig. 4): each algorithm's default point at every epsilon.
* :func:`heatmap` (Fig. 7, Fig. 9): DP-AdaFEST over ``sigma1/sigma2 x tau``.

Every point is trained over the preset's seeds (:class:`sparse_dp.jobs.study.runner.runs.Runner`);
with a held-out test split (the ``paper`` preset) each point also carries its test AUC and its
paired difference from DP-SGD's (:func:`sparse_dp.jobs.study.runner.runs.paired_difference`),
the frontier picked on validation AUC. ``refine`` adds finer grids around the coarse frontier
(:func:`refined_points`); ``from_cache`` trains nothing. See docs/commands/study.md.
"""

from __future__ import annotations

import math
import pathlib
from typing import Optional, Sequence

from sparse_dp.jobs.study.presets import StudyPreset
from sparse_dp.jobs.study.runner.inputs import SYNTHETIC, StudyInputs
from sparse_dp.jobs.study.runner.runs import MissingRun, Point, Runner, paired_difference

# Rounds of refinement after the coarse grid (:func:`refined_points`), each between the
# frontier's bracket of the grid trained so far.
REFINE_ROUNDS = 2
# AUC losses relative to DP-SGD at which Fig. 3 reads the best reduction.
AUC_LOSS_THRESHOLDS = (0.001, 0.005, 0.01, 0.02, 0.05)


def runner(preset: StudyPreset, data: str, out: pathlib.Path,
           from_cache: bool = False) -> Runner:
  """The preset's runner on ``data``; synthetic data drawn per seed where the preset
  resamples them (the last seed's inputs kept in memory; real files are read once).
  ``from_cache``: synthetic data are described, not drawn (the runs are read, none trained)."""
  resample = preset.resample_data and data == SYNTHETIC

  def load(seed: int) -> StudyInputs:
    data_seed = seed if resample else 0
    if from_cache and data == SYNTHETIC:
      return StudyInputs.described(preset.examples, preset.synthetic_scale, preset.features,
                                   preset.max_examples, data_seed, preset.test_split)
    return StudyInputs.load(data, preset.examples, preset.synthetic_scale, preset.features,
                            pathlib.Path(out) / "data", max_examples=preset.max_examples,
                            data_seed=data_seed, test_split=preset.test_split)
  loaded: dict[int, StudyInputs] = {}

  def inputs_for_seed(seed: int) -> StudyInputs:
    if seed not in loaded:
      loaded.clear()
      loaded[seed] = load(seed)
    return loaded[seed]
  first = inputs_for_seed(preset.seeds[0])
  return Runner(first, preset, out, inputs_for_seed if resample else None,
                from_cache=from_cache)


def summaries(runs: Runner, points: Sequence[Point]) -> tuple[list[dict], list[str]]:
  """The points' summaries, seed by seed (one data set in memory at a time), and the
  labels of the points a ``from_cache`` runner has not all runs of."""
  for seed in runs.preset.seeds:  # trains (or reads) every run of one seed's data first
    for point in points:
      try:
        runs.run(point, seed)
      except MissingRun:
        pass
  done, missing = [], []
  for point in points:
    try:
      done.append(runs.summary(point))
    except MissingRun:
      missing.append(point.label)
  return done, missing


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


def sweep_points(preset: StudyPreset) -> list[Point]:
  """The preset's coarse grid at its epsilon: the non-private model, DP-SGD, DP-FEST
  over ``fest_ks`` (and at ``fest_shares``), DP-AdaFEST at the first noise ratio over
  ``tau_sigmas`` and the absolute ``taus``, then (where there are ``taus``) at the
  first threshold over the other noise ratios, and at the largest absolute ``tau`` over
  the contribution clips ``C1``;
  DP-AdaFEST+ at ``adafest_plus``'s ``(k, tau)`` and its first ``k`` over ``taus``.
  The smoke and full presets' sweeps are the first, third and fifth of these."""
  eps, ratio = preset.epsilon, preset.sigma_ratios[0]
  points = [Point("none", None), Point("dpsgd", eps)]
  points += [Point("fest", eps, fest_k=k) for k in preset.fest_ks]
  points += [Point("fest", eps, fest_k=k, flags=(("selection_share", share),))
             for k, share in preset.fest_shares]
  points += [Point("adafest", eps, tau_sigmas=t, sigma_ratio=ratio) for t in preset.tau_sigmas]
  points += [Point("adafest", eps, sigma_ratio=ratio, flags=(("tau", t),)) for t in preset.taus]
  if preset.taus:  # the paper preset: the other noise ratios at the first threshold
    points += [Point("adafest", eps, tau_sigmas=preset.tau_sigmas[0], sigma_ratio=r)
               for r in preset.sigma_ratios[1:]]
  # C1 at the largest absolute threshold: with tau in sigma units the map, its noise
  # sigma1 C1 and tau all scale with C1 while the clip binds, so every C1 is one point.
  points += [Point("adafest", eps, sigma_ratio=ratio,
                   flags=(("tau", max(preset.taus)), ("contribution_clip", c)))
             for c in preset.contribution_clips[1:]]
  points += [Point("adafest+", eps, fest_k=k, tau_sigmas=t, sigma_ratio=ratio)
             for k, t in preset.adafest_plus]
  points += [Point("adafest+", eps, fest_k=preset.adafest_plus[0][0], sigma_ratio=ratio,
                   flags=(("tau", t),)) for t in preset.taus]
  return points


def refined_points(points: list[dict], preset: StudyPreset, loss: float = 0.005) -> list[Point]:
  """A finer grid where the trained one brackets the frontier: per algorithm, between
  its sparsest point within ``loss`` of DP-SGD's validation AUC and the next sparser
  point of its sweep, the geometric midpoint of the swept value (DP-FEST's ``k``,
  DP-AdaFEST's ``tau_sigmas``; DP-AdaFEST+ both); and the same along each sweep of the
  absolute ``tau`` (:func:`_absolute_tau_midpoints`)."""
  (baseline,) = [p for p in points if p["algorithm"] == "dpsgd"]
  refined = []
  for algorithm in ("fest", "adafest", "adafest+"):
    swept = [p for p in points if p["algorithm"] == algorithm and not p["flags"]]
    bracket = _bracket(swept, baseline["auc_mean"] - loss)
    if bracket is None:
      continue
    best, nearest = bracket
    middle = {key: (None if best[key] is None or nearest[key] is None
                    else math.sqrt(best[key] * nearest[key]))
              for key in ("fest_k", "tau_sigmas")}
    refined.append(Point(algorithm, preset.epsilon,
                         fest_k=None if middle["fest_k"] is None else round(middle["fest_k"]),
                         tau_sigmas=(None if middle["tau_sigmas"] is None
                                     else round(middle["tau_sigmas"], 2)),
                         sigma_ratio=best["sigma_ratio"]))
  refined += _absolute_tau_midpoints(points, baseline["auc_mean"] - loss, preset.epsilon)
  return [p for p in dict.fromkeys(refined) if p.label not in {q["label"] for q in points}]


def _bracket(swept: list[dict], floor: float) -> Optional[tuple[dict, dict]]:
  """The sparsest of ``swept`` with validation AUC >= ``floor`` and the least sparse
  sparser one below it, or None where they do not bracket the frontier."""
  within = [p for p in swept if p["auc_mean"] >= floor]
  if not within:
    return None
  best = max(within, key=lambda p: p["gradient_size_reduction"])
  sparser = [p for p in swept if p["gradient_size_reduction"] > best["gradient_size_reduction"]
             and p["auc_mean"] < floor]
  if not sparser:
    return None
  return best, min(sparser, key=lambda p: p["gradient_size_reduction"])


def _absolute_tau_midpoints(points: list[dict], floor: float, epsilon: float) -> list[Point]:
  """Along each sweep of the absolute threshold ``tau`` (points alike in all else), the
  geometric midpoint of the ``tau`` of the bracket of the frontier (:func:`_bracket`)."""
  sweeps: dict[tuple, list[dict]] = {}
  for p in points:
    flags = tuple(tuple(flag) for flag in p["flags"])
    if any(name == "tau" for name, _ in flags):
      rest = tuple(flag for flag in flags if flag[0] != "tau")
      sweeps.setdefault((p["algorithm"], p["fest_k"], p["sigma_ratio"], rest), []).append(p)
  refined = []
  for (algorithm, fest_k, sigma_ratio, _), swept in sweeps.items():
    bracket = _bracket(swept, floor)
    if bracket is None:
      continue
    best, nearest = (dict(tuple(flag) for flag in p["flags"]) for p in bracket)
    tau = round(math.sqrt(best["tau"] * nearest["tau"]), 1)
    refined.append(Point(algorithm, epsilon, fest_k=fest_k, sigma_ratio=sigma_ratio,
                         flags=tuple((name, tau if name == "tau" else value)
                                     for name, value in best.items())))
  return refined


def tradeoffs(preset: StudyPreset, data: str, out: pathlib.Path,
              points: Optional[Sequence[Point]] = None, from_cache: bool = False) -> dict:
  """``points`` (a grid's, :mod:`sparse_dp.jobs.study.runner.grid`; default: the preset's sweep,
  refined where the preset says so) over the preset's seeds, and the best reduction of
  each algorithm within an AUC loss of the one DP-SGD point's AUC."""
  refine = points is None and preset.refine
  points = list(sweep_points(preset) if points is None else points)
  baselines = [p for p in points if p.algorithm == "dpsgd"]
  if len(baselines) != 1:
    raise ValueError(f"the tradeoffs study compares every point with one DP-SGD point; "
                     f"give exactly one (got {[p.label for p in baselines]})")
  runs = runner(preset, data, out, from_cache)
  done, missing = summaries(runs, points)
  for _ in range(REFINE_ROUNDS if refine else 0):  # each round's midpoints once trained
    more = refined_points(done, preset) if not missing else []
    if not more:
      break
    more, missing = summaries(runs, more)
    done += more
  if not any(p["algorithm"] == "dpsgd" for p in done):
    raise MissingRun(f"the DP-SGD point is not in the cache under {runs.folder}: train it "
                     "(run the study without --from-cache)")
  pair_with_baseline(done)
  return _report("tradeoffs", runs, done, epsilon=baselines[0].epsilon,
                 best_reduction=best_reduction(done, AUC_LOSS_THRESHOLDS), missing=missing)


def pair_with_baseline(points: list[dict]) -> None:
  """Adds to each point its paired difference from DP-SGD's AUC over seeds
  (``auc_vs_dpsgd``; ``test_auc_vs_dpsgd`` where there is a test split)."""
  (baseline,) = [p for p in points if p["algorithm"] == "dpsgd"]
  for point in points:
    for key in ("auc", "test_auc"):
      if key in point and key in baseline:
        point[f"{key}_vs_dpsgd"] = paired_difference(point[key], baseline[key])


def best_reduction(points: list[dict], thresholds) -> list[dict]:
  """Per private algorithm and AUC-loss threshold ``t``: its point of largest mean
  gradient-size reduction among those with mean (validation) AUC >= DP-SGD's - ``t``
  (Fig. 3), with its test AUC and paired differences from DP-SGD where the points
  have them."""
  (baseline,) = [p for p in points if p["algorithm"] == "dpsgd"]
  reported = ("gradient_size_reduction", "gradient_size_reduction_std", "auc_mean", "auc_std",
              "epsilon_spent", "test_auc_mean", "auc_vs_dpsgd", "test_auc_vs_dpsgd")
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
                   **{key: best and best.get(key) for key in reported}})
  return rows


def epsilon_sweep(preset: StudyPreset, data: str, out: pathlib.Path,
                  points: Optional[Sequence[Point]] = None, from_cache: bool = False) -> dict:
  """``points`` (a grid's; default: each of the preset's algorithms' first point at each
  of its epsilons), one panel per target epsilon (Fig. 4)."""
  if points is None:
    points = [default_point(a, e, preset) for e in preset.epsilons
              for a in preset.epsilon_algorithms]
  unprivate = [p.label for p in points if p.epsilon is None]
  if unprivate:
    raise ValueError(f"--grid: the epsilon study draws each point at its target epsilon; "
                     f"{', '.join(unprivate)} has none: leave algorithm none out")
  runs = runner(preset, data, out, from_cache)
  done, missing = summaries(runs, points)
  return _report("epsilon", runs, done, missing=missing,
                 epsilons=sorted({p.epsilon for p in points}))


def heatmap(preset: StudyPreset, data: str, out: pathlib.Path,
            points: Optional[Sequence[Point]] = None, from_cache: bool = False) -> dict:
  """DP-AdaFEST over sigma1/sigma2 x tau (Fig. 7/9): the preset's ``sigma_ratios`` x
  ``tau_sigmas``, or a grid's points, one per (sigma_ratio, tau_sigmas) cell at one
  epsilon."""
  if points is None:
    points = [Point("adafest", preset.epsilon, tau_sigmas=t, sigma_ratio=r)
              for r in preset.sigma_ratios for t in preset.tau_sigmas]
  _check_heatmap(points)
  runs = runner(preset, data, out, from_cache)
  done, missing = summaries(runs, points)
  return _report("heatmap", runs, done, epsilon=points[0].epsilon, missing=missing,
                 sigma_ratios=sorted({p.sigma_ratio for p in points}),
                 tau_sigmas=sorted({p.tau_sigmas for p in points}))


def _check_heatmap(points: Sequence[Point]) -> None:
  """The heatmap's cells are (sigma1/sigma2, tau in units of sigma1 C1) at one epsilon:
  refuses a grid whose points leave a cell without its axes or give it twice."""
  off_axes = [p.label for p in points if p.tau_sigmas is None or p.sigma_ratio is None]
  if off_axes:
    raise ValueError(f"--grid: the heatmap's axes are sigma_ratio and tau_sigmas of "
                     f"DP-AdaFEST (or DP-AdaFEST+); {', '.join(off_axes)} has no cell: give "
                     "algorithm adafest with tau_sigmas (not tau) and sigma_ratio")
  epsilons = sorted({p.epsilon for p in points})
  if len(epsilons) > 1:
    raise ValueError(f"--grid: the heatmap is drawn at one epsilon; the grid gives {epsilons}")
  cells: dict = {}
  for p in points:
    cells.setdefault((p.sigma_ratio, p.tau_sigmas), []).append(p.label)
  shared = [labels for labels in cells.values() if len(labels) > 1]
  if shared:
    raise ValueError(f"--grid: the heatmap has one point per (sigma_ratio, tau_sigmas) cell; "
                     f"{' and '.join(shared[0])} share one: vary only sigma_ratio and "
                     "tau_sigmas")
