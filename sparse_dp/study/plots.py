"""Figures drawn from a study's JSON report alone, so they always match it.

Every trained point is drawn with its mean AUC and the sample standard
deviation over seeds (error bars, or ``±`` in a heatmap cell) and labelled
with :func:`point_text`: AUC, epsilon spent and gradient-size reduction.
:func:`save` stamps the PNG with the SHA-256 of the JSON it was drawn from
(PNG text chunk ``Source``).
"""

from __future__ import annotations

import hashlib
import math
import pathlib

ALGORITHM_COLORS = {"none": "black", "dpsgd": "tab:gray", "fest": "tab:blue",
                    "adafest": "tab:red", "adafest+": "tab:purple"}


def _pyplot():
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  return plt


def point_text(point: dict) -> str:
  """AUC mean ± spread over seeds, epsilon spent, gradient-size reduction."""
  epsilon = point["epsilon_spent"]
  return (f"AUC {point['auc_mean']:.3f}±{point['auc_std']:.3f}\n"
          f"ε={'∞' if epsilon is None else f'{epsilon:.2g}'}, "
          f"{point['gradient_size_reduction']:.3g}x")


def _tradeoff_axis(axis, points: list[dict], title: str) -> None:
  """AUC (error bars over seeds) against gradient-size reduction, one colour per algorithm."""
  labelled = set()
  for point in points:
    algorithm = point["algorithm"]
    axis.errorbar(point["gradient_size_reduction"], point["auc_mean"], yerr=point["auc_std"],
                  xerr=point["gradient_size_reduction_std"], fmt="o", capsize=3,
                  color=ALGORITHM_COLORS.get(algorithm),
                  label=None if algorithm in labelled else algorithm)
    labelled.add(algorithm)
    axis.annotate(point_text(point), (point["gradient_size_reduction"], point["auc_mean"]),
                  textcoords="offset points", xytext=(4, 4), fontsize=6)
  axis.set_xscale("log")
  axis.set(xlabel="gradient-size reduction (rows / rows updated per step)",
           ylabel="held-out AUC (mean ± sd over seeds)", title=title)
  axis.legend(fontsize=7)


def _tradeoffs(report: dict, plt):
  figure, (scatter, best) = plt.subplots(1, 2, figsize=(13, 5))
  _tradeoff_axis(scatter, report["points"],
                 f"Fig. 8 analogue: utility / sparsity at ε={report['epsilon']:g}")
  for algorithm in dict.fromkeys(r["algorithm"] for r in report["best_reduction"]):
    rows = [r for r in report["best_reduction"] if r["algorithm"] == algorithm
            and r["gradient_size_reduction"] is not None]
    best.plot([r["auc_loss_threshold"] for r in rows],
              [r["gradient_size_reduction"] for r in rows], marker="o",
              color=ALGORITHM_COLORS.get(algorithm), label=algorithm)
    for row in rows:
      best.annotate(point_text(row),
                    (row["auc_loss_threshold"], row["gradient_size_reduction"]),
                    textcoords="offset points", xytext=(4, 4), fontsize=6)
  best.set(xscale="log", yscale="log", xlabel="AUC loss allowed vs DP-SGD",
           ylabel="best gradient-size reduction",
           title=f"Fig. 3 analogue: best reduction within an AUC loss (ε={report['epsilon']:g})")
  best.legend(fontsize=7)
  return figure


def _epsilon(report: dict, plt):
  epsilons = report["epsilons"]
  figure, axes = plt.subplots(1, len(epsilons), figsize=(4.5 * len(epsilons), 4.5),
                              squeeze=False, sharey=True)
  for axis, epsilon in zip(axes[0], epsilons):
    _tradeoff_axis(axis, [p for p in report["points"] if p["epsilon"] == epsilon],
                   f"Fig. 4 analogue: target ε={epsilon:g}")
  return figure


def _heatmap(report: dict, plt):
  ratios, taus = report["sigma_ratios"], report["tau_sigmas"]
  cell = {(p["sigma_ratio"], p["tau_sigmas"]): p for p in report["points"]}
  figure, axes = plt.subplots(1, 2, figsize=(5 + 2.2 * len(taus), 1.5 + 1.3 * len(ratios)))
  for axis, (key, title, transform) in zip(axes, [
      ("auc_mean", "held-out AUC", float),
      ("gradient_size_reduction", "log10 gradient-size reduction", math.log10)]):
    grid = [[transform(cell[(r, t)][key]) for t in taus] for r in ratios]
    image = axis.imshow(grid, cmap="viridis", aspect="auto")
    figure.colorbar(image, ax=axis)
    for i, r in enumerate(ratios):
      for j, t in enumerate(taus):
        axis.text(j, i, point_text(cell[(r, t)]), ha="center", va="center", fontsize=6,
                  color="white")
    axis.set(xticks=range(len(taus)), xticklabels=[f"{t:g}" for t in taus],
             yticks=range(len(ratios)), yticklabels=[f"{r:g}" for r in ratios],
             xlabel="τ (units of σ1·C1)", ylabel="σ1/σ2", title=title)
  figure.suptitle(f"Fig. 7/9 analogue: DP-AdaFEST at ε={report['epsilon']:g}")
  return figure


def _streaming(report: dict, plt):
  figure, (scatter, periods) = plt.subplots(1, 2, figsize=(13, 5))
  _tradeoff_axis(scatter, report["points"],
                 f"Fig. 5 analogue: last period, ε={report['epsilon']:g} in all")
  for point in report["points"]:
    rows = point["periods"]
    periods.errorbar([r["period"] for r in rows], [r["auc_mean"] for r in rows],
                     yerr=[r["auc_std"] for r in rows], marker="o", capsize=3,
                     label=point["label"])
    for row in rows:
      periods.annotate(point_text(row), (row["period"], row["auc_mean"]),
                       textcoords="offset points", xytext=(4, 4), fontsize=6)
  periods.set(xlabel=f"period ({report['streaming_period']} day(s) each)",
              ylabel="AUC on the evaluation days", title="each period, warm-started")
  periods.legend(fontsize=7)
  return figure


def _step_time(report: dict, plt):
  figure, (steps, throughput) = plt.subplots(1, 2, figsize=(13, 5))
  for trainer in dict.fromkeys(r["trainer"] for r in report["bench"]["results"]):
    rows = [r for r in report["bench"]["results"]
            if r["trainer"] == trainer and "seconds_per_step" in r]
    steps.plot([r["vocab"] for r in rows], [r["seconds_per_step"] for r in rows], marker="o",
               label=trainer)
  steps.set(xscale="log", yscale="log", xlabel="vocabulary size", ylabel="seconds per step",
            title="Table 4 analogue: one table, dim 64, batch 1024 (timing only)")
  steps.legend(fontsize=7)
  for algorithm in dict.fromkeys(p["algorithm"] for p in report["points"]):
    rows = [p for p in report["points"] if p["algorithm"] == algorithm]
    throughput.plot([p["vocabulary_scale"] for p in rows],
                    [p["examples_per_second"] for p in rows], marker="o",
                    color=ALGORITHM_COLORS.get(algorithm), label=algorithm)
    for row in rows:
      throughput.annotate(point_text(row), (row["vocabulary_scale"], row["examples_per_second"]),
                          textcoords="offset points", xytext=(4, 4), fontsize=6)
  for line, scale in enumerate(report.get("not_run", [])):
    throughput.text(0.0, -0.16 - 0.06 * line,
                    f"x{scale['vocabulary_scale']:g} not run: {scale['reason']}",
                    transform=throughput.transAxes, fontsize=7, va="top", wrap=True)
  throughput.set(xscale="log", xlabel="vocabulary scale (x Table 3)",
                 ylabel="examples / second (fit wall time)", title="pCTR job throughput")
  throughput.legend(fontsize=7)
  return figure


_FIGURES = {"tradeoffs": _tradeoffs, "epsilon": _epsilon, "heatmap": _heatmap,
            "streaming": _streaming, "step-time": _step_time}


def figure(report: dict):
  """The report's figure (a matplotlib ``Figure``; close it when done)."""
  plt = _pyplot()
  drawn = _FIGURES[report["study"]](report, plt)
  drawn.tight_layout()
  return drawn


def save(report: dict, json_path: pathlib.Path, png_path: pathlib.Path) -> None:
  """Draws the report as written to ``json_path`` into ``png_path``, stamped with its hash."""
  digest = hashlib.sha256(pathlib.Path(json_path).read_bytes()).hexdigest()
  drawn = figure(report)
  drawn.savefig(png_path, dpi=110,
                metadata={"Source": f"{pathlib.Path(json_path).name} sha256={digest}"})
  _pyplot().close(drawn)
