"""Figures drawn from a study's JSON report alone, so they always match it.

Every trained point is drawn with its mean AUC and the sample standard
deviation over seeds (error bars) in its algorithm's colour and marker
(:data:`ALGORITHM_COLORS`, :data:`ALGORITHM_MARKERS`, the same in every figure)
and labelled with its configuration (``k``, ``tau``, ``sigma1/sigma2``), moved clear of
the labels beside it (a trade-off scatter of many points is numbered, with a key); heatmap
cells carry their value only, in a font that can be read. Legends sit outside
the axes, and every figure's title line states its scale: examples, table rows
and seeds (:func:`scale_text`).
:func:`save` stamps the PNG with the SHA-256 of the JSON it was drawn from
(PNG text chunk ``Source``).
"""

from __future__ import annotations

import hashlib
import math
import pathlib

from sparse_dp.jobs.study.reports.claims import PAPER_FRONTIER, PAPER_LOSS, reduction_ceiling

# Dots per inch of the saved figures, and of their layout.
DPI = 110

ALGORITHM_COLORS = {"none": "black", "dpsgd": "tab:gray", "fest": "tab:blue",
                    "adafest": "tab:red", "adafest+": "tab:purple"}
ALGORITHM_MARKERS = {"none": "*", "dpsgd": "s", "fest": "^", "adafest": "o", "adafest+": "D"}


def scale_text(report: dict) -> str:
  """The report's scale: training and held-out examples, table rows, seeds, preset and
  optimizer."""
  source, preset = report.get("source") or {}, report.get("preset") or {}
  parts = []
  if "train_examples" in source:
    parts.append(f"{source['train_examples']:,} train / {source['held_out_examples']:,} "
                 + ("validation / " + f"{source['test_examples']:,} test"
                    if "test_examples" in source else "held-out") + " examples")
  if report.get("table_rows"):
    parts.append(f"{report['table_rows']:,} table rows")
  if preset.get("seeds"):
    shown = sorted({len(p["seeds"]) for p in report.get("points", []) if "seeds" in p})
    n = len(preset["seeds"])
    counted = (f"n={n} seeds" if not shown or shown == [n] else
               f"n={shown[0]}{'' if len(shown) == 1 else f' to {shown[-1]}'} of {n} seeds "
               "(the rest not yet trained)")
    parts.append(counted + (" (data drawn per seed)" if preset.get("resample_data") else ""))
  if preset.get("name"):
    parts.append(f"preset {preset['name']}")
  if preset.get("optimizer"):
    parts.append(f"{preset['optimizer']} at learning rate {preset['learning_rate']:g}")
  return ", ".join(parts)


def configuration(point: dict) -> str:
  """A point's configuration without its algorithm (``k=300 tau=2s``)."""
  return point["label"].split(" ", 1)[1] if " " in point["label"] else ""


def _pyplot():
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  return plt


def _legend(axis) -> None:
  """The axis's legend outside it, on the right, where no point or label lies."""
  if axis.get_legend_handles_labels()[1]:
    axis.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def paired_with_dpsgd(report: dict) -> bool:
  """Whether the report's figure shows each private point's AUC as its paired difference
  from DP-SGD's: a preset whose seeds draw their own data (``resample_data``), where the
  spread over seeds is mostly the data's and hides the differences between points."""
  return bool((report.get("preset") or {}).get("resample_data")) and all(
      "auc_vs_dpsgd" in p for p in report["points"])


def _auc_bar(point: dict, paired: bool) -> tuple[float, float]:
  """(y, half height of its error bar): mean AUC ± sd over seeds, or, ``paired``, the
  mean of the seedwise differences from DP-SGD's AUC ± its 95% t half-width."""
  if not paired:
    return point["auc_mean"], point["auc_std"]
  difference = point["auc_vs_dpsgd"]
  return difference["mean"], (0.0 if difference["high"] is None
                              else difference["high"] - difference["mean"])


def _tradeoff_axis(axis, points: list[dict], title: str, legend: bool = True,
                   paired: bool = False, numbered: bool = False) -> list[tuple[str, dict]]:
  """AUC (error bars over seeds; ``paired``: the paired difference from DP-SGD's, the
  non-private point left to the title) against gradient-size reduction, one colour and
  marker per algorithm, each point labelled (:func:`_label`) with its configuration or
  (``numbered``) a number, the returned ``(number, point)`` pairs being their key
  (:func:`_key`); ``legend``: the algorithms' key, to the right of the axis."""
  labelled, labels = set(), []
  for point in points:
    algorithm = point["algorithm"]
    if paired and algorithm == "none":
      continue
    auc, bar = _auc_bar(point, paired)
    axis.errorbar(point["gradient_size_reduction"], auc, yerr=bar,
                  xerr=point["gradient_size_reduction_std"],
                  fmt=ALGORITHM_MARKERS.get(algorithm, "o"), capsize=3,
                  color=ALGORITHM_COLORS.get(algorithm),
                  label=None if algorithm in labelled else algorithm)
    labelled.add(algorithm)
    text = str(len(labels) + 1) if numbered else configuration(point)
    _label(axis, text, (point["gradient_size_reduction"], auc), algorithm)
    labels.append((text, point))
  _log_x(axis)
  if paired:
    axis.axhline(0.0, color=ALGORITHM_COLORS["dpsgd"], linewidth=1)
    (none,) = [p for p in points if p["algorithm"] == "none"] or [None]
    if none is not None:
      title += f"\n(non-private: {none['auc_vs_dpsgd']['mean']:+.3f} from DP-SGD)"
  axis.set(xlabel="gradient-size reduction (rows / rows updated per step)",
           ylabel=("validation AUC − DP-SGD's (paired over seeds, 95% t)" if paired
                   else "held-out AUC (mean ± sd over seeds)"), title=title)
  if legend:
    _legend(axis)
  return labels


# The gid of the labels :func:`_place_labels` moves clear of each other.
POINT_LABEL = "point-label"


def _label(axis, text: str, xy: tuple[float, float], algorithm: str) -> None:
  """A point's label in its algorithm's colour, placed by :func:`_place_labels` (none
  where ``text`` is empty: DP-SGD's configuration)."""
  if not text:
    return
  colour = ALGORITHM_COLORS.get(algorithm, "black")
  axis.annotate(text, xy, xytext=(4, 2), textcoords="offset points", fontsize=7,
                color=colour, ha="left", va="bottom", gid=POINT_LABEL,
                arrowprops={"arrowstyle": "-", "linewidth": 0.5, "color": colour,
                            "shrinkA": 0, "shrinkB": 3})


def _place_labels(figure) -> None:
  """Moves every point label (:func:`_label`) of the laid-out ``figure`` clear of the
  points and the labels placed before it on its axis (taken by their points' x, then
  y): right of its point (left where it would leave the axis, never past its left
  edge), at the height nearest the point's where its drawn box overlaps none placed,
  with a thin line to the point when moved. Sizes are measured at the figure's dpi,
  the one it is saved at."""
  from matplotlib.text import Text
  renderer = figure.canvas.get_renderer()
  to_points = 72.0 / figure.dpi
  gap, marker = 4.0 / to_points, 3.5 / to_points  # px; marker: half a marker's width
  for axis in figure.axes:
    # Each label with its point in pixels, taken by the points' x, then y.
    anchored = sorted(((tuple(axis.transData.transform(t.xy)), t) for t in axis.texts
                       if t.get_gid() == POINT_LABEL), key=lambda pair: pair[0])
    frame = axis.get_window_extent(renderer)
    placed = [(x - marker, y - marker, x + marker, y + marker)  # boxes (x0, y0, x1, y1), px
              for (x, y), _ in anchored]

    def free(left, bottom, width, height):
      return not any(x0 < left + width and left < x1 and y0 < bottom + height
                     and bottom < y1 for x0, y0, x1, y1 in placed)

    for (at_x, at_y), label in anchored:
      box = Text.get_window_extent(label, renderer)  # the text's, without its line
      width, height = box.width, max(box.height, 1.0)
      left = (at_x + gap if at_x + gap + width <= frame.x1
              else max(at_x - gap - width, frame.x0))
      start = at_y - height / 2
      lines = [0] + [k for j in range(1, int(frame.height // height) + 1) for k in (j, -j)]
      bottom = next((start + k * height for k in lines
                     if frame.y0 <= start + k * height <= frame.y1 - height
                     and free(left, start + k * height, width, height)), start)
      placed.append((left, bottom, left + width, bottom + height))
      label.xyann = ((left - at_x) * to_points, (bottom - at_y) * to_points)
      label.arrow_patch.set_visible(abs(bottom - start) > 0.5)


def _key(axis, numbers: list[tuple[str, dict]], columns: int, fontsize: float = 7) -> None:
  """The key of numbered points (:func:`_tradeoff_axis`): each number and its point's
  label (algorithm and configuration) in the algorithm's colour, in ``columns`` columns
  read down."""
  axis.set_axis_off()
  rows = -(-len(numbers) // columns)
  for index, (number, point) in enumerate(numbers):
    column, row = divmod(index, rows)
    x, y = column / columns, 1.0 - (row + 1) / rows
    colour = ALGORITHM_COLORS.get(point["algorithm"], "black")
    axis.text(x, y, number, color=colour, fontsize=fontsize, fontweight="bold",
              transform=axis.transAxes)
    axis.annotate(point["label"], (x, y), xycoords="axes fraction", xytext=(2.5 * fontsize, 0),
                  textcoords="offset points", color=colour, fontsize=fontsize)


# More points than this in the trade-off scatter are numbered, their labels in a key.
MAX_LABELLED_POINTS = 12


def _tradeoffs(report: dict, plt):
  """Fig. 8's scatter (every point; beyond :data:`MAX_LABELLED_POINTS` numbered, with a key)
  and Fig. 3's best reduction within each AUC loss."""
  numbered = len(report["points"]) > MAX_LABELLED_POINTS
  if numbered:
    figure, axes = plt.subplot_mosaic([["scatter", "scatter"], ["key", "best"]],
                                      figsize=(15, 12), height_ratios=(1.1, 1))
    scatter, best = axes["scatter"], axes["best"]
  else:
    figure, (scatter, best) = plt.subplots(1, 2, figsize=(15, 5.5))
  points = _tradeoff_axis(scatter, report["points"],
                          f"Fig. 8 analogue: utility / sparsity at ε={report['epsilon']:g}",
                          paired=paired_with_dpsgd(report), numbered=numbered)
  if numbered:
    _key(axes["key"], points, columns=2)
  for algorithm in dict.fromkeys(r["algorithm"] for r in report["best_reduction"]):
    rows = [r for r in report["best_reduction"] if r["algorithm"] == algorithm
            and r["gradient_size_reduction"] is not None]
    best.errorbar([r["auc_loss_threshold"] for r in rows],
                  [r["gradient_size_reduction"] for r in rows],
                  yerr=[r.get("gradient_size_reduction_std") or 0.0 for r in rows],
                  marker=ALGORITHM_MARKERS.get(algorithm, "o"), capsize=3,
                  color=ALGORITHM_COLORS.get(algorithm), label=algorithm)
    for before, row in zip([None] + rows, rows):  # a point's label once, where it first wins
      if before is None or before["label"] != row["label"]:
        _label(best, configuration(row),
               (row["auc_loss_threshold"], row["gradient_size_reduction"]), algorithm)
  _frontier_marks(best, report)
  best.set(xscale="log", yscale="log", xlabel="AUC loss allowed vs DP-SGD (validation)",
           ylabel="best gradient-size reduction (± sd over seeds)",
           title=f"Fig. 3 analogue: best reduction within an AUC loss (ε={report['epsilon']:g})")
  _legend(best)
  return figure


def _frontier_marks(axis, report: dict) -> None:
  """Where the data stop short: the most any run on these tables can show (one row a
  step), and per algorithm the paper's reduction and this package's target at AUC loss
  0.005 (:data:`sparse_dp.jobs.study.reports.claims.PAPER_FRONTIER`)."""
  ceiling = reduction_ceiling(report)
  if ceiling:
    axis.axhline(ceiling, color="black", linestyle=":", linewidth=1,
                 label=f"ceiling: {ceiling:,.0f} rows / 1 row a step")
  shown = {r["algorithm"] for r in report["best_reduction"]}
  for algorithm, paper, target in PAPER_FRONTIER:
    if algorithm in shown:
      axis.plot([PAPER_LOSS], [paper], marker="*", markersize=12, linestyle="none",
                color=ALGORITHM_COLORS[algorithm], label=f"{algorithm}: the paper, {paper:.0e}x")
      axis.plot([PAPER_LOSS], [target], marker="_", markersize=20, linestyle="none",
                color=ALGORITHM_COLORS[algorithm], label=f"{algorithm}: target, {target:.0e}x")


def _epsilon(report: dict, plt):
  epsilons = report["epsilons"]
  figure, axes = plt.subplots(1, len(epsilons), figsize=(5.5 * len(epsilons), 4.5),
                              squeeze=False, sharey=True)
  for axis, epsilon in zip(axes[0], epsilons):  # one key, right of the last panel
    _tradeoff_axis(axis, [p for p in report["points"] if p["epsilon"] == epsilon],
                   f"Fig. 4 analogue: target ε={epsilon:g}", legend=axis is axes[0][-1])
  return figure


def _heatmap(report: dict, plt):
  ratios, taus = report["sigma_ratios"], report["tau_sigmas"]
  cell = {(p["sigma_ratio"], p["tau_sigmas"]): p for p in report["points"]}
  figure, axes = plt.subplots(1, 2, figsize=(5 + 2.2 * len(taus), 1.5 + 1.3 * len(ratios)))
  for axis, (key, title, transform) in zip(axes, [
      ("auc_mean", "held-out AUC", float),
      ("gradient_size_reduction", "log10 gradient-size reduction", math.log10)]):
    grid = [[transform(cell[(r, t)][key]) if (r, t) in cell else math.nan for t in taus]
            for r in ratios]
    image = axis.imshow(grid, cmap="viridis", aspect="auto")
    figure.colorbar(image, ax=axis)
    for i, r in enumerate(ratios):
      for j, t in enumerate(taus):
        if (r, t) in cell:  # the value alone, large enough to read; white on dark cells
          value = grid[i][j]
          low, high = image.get_clim()
          axis.text(j, i, f"{value:.3f}" if key == "auc_mean" else f"{value:.2f}",
                    ha="center", va="center", fontsize=10,
                    color="white" if value < (low + high) / 2 else "black")
    axis.set(xticks=range(len(taus)), xticklabels=[f"{t:g}" for t in taus],
             yticks=range(len(ratios)), yticklabels=[f"{r:g}" for r in ratios],
             xlabel="τ (units of σ1·C1)", ylabel="σ1/σ2", title=title)
  figure.suptitle(f"Fig. 7/9 analogue: DP-AdaFEST at ε={report['epsilon']:g} "
                  "(mean over seeds; the table gives the spread)")
  return figure


def _log_x(axis) -> None:
  """A log x axis labelled at its powers of ten, or at 2, 3, 4, ... times one where the
  points lie within a decade (no power of ten in view)."""
  from matplotlib import ticker
  axis.set_xscale("log")
  low, high = axis.get_xlim()
  within_a_decade = math.floor(math.log10(low)) == math.floor(math.log10(high))
  axis.xaxis.set_minor_formatter(
      ticker.FuncFormatter(lambda x, _: f"{x:g}") if within_a_decade
      else ticker.NullFormatter())  # minor labels of a short decade collide


def _chance(axis) -> None:
  axis.axhline(0.5, color="grey", linestyle=":", linewidth=1, label="chance (AUC 0.5)")


def _streaming(report: dict, plt):
  """The last period's AUC against the reduction, and per period length (Fig. 5's T) each
  stream's AUC after every period, placed at the period's last training day."""
  lengths = report.get("streaming_periods") or [report["streaming_period"]]
  rows = (len(lengths) + 2) // 2
  figure, axes = plt.subplots(rows, 2, figsize=(15, 5.5 * rows), squeeze=False)
  scatter, panels = axes.flat[0], list(axes.flat[1:])
  _chance(scatter)
  _tradeoff_axis(scatter, report["points"],
                 f"Fig. 5 analogue: last period, ε={report['epsilon']:g} in all")
  from matplotlib.ticker import MaxNLocator
  for length, axis in zip(lengths, panels):
    shown = [p for p in report["points"] if p.get("streaming_period", length) == length]
    for index, point in enumerate(shown):
      periods = point["periods"]
      axis.errorbar([max(r["days"]) for r in periods], [r["auc_mean"] for r in periods],
                    yerr=[r["auc_std"] for r in periods], capsize=3, label=point["label"],
                    marker=ALGORITHM_MARKERS.get(point["algorithm"], "o"),
                    color=ALGORITHM_COLORS.get(point["algorithm"]),
                    linestyle=["-", "--", ":", "-."][index % 4])
    _chance(axis)
    if not shown:
      axis.text(0.5, 0.5, f"T = {length}: not yet trained (see 'missing')", ha="center",
                va="center", transform=axis.transAxes)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set(xlabel="last training day of the period", ylabel="AUC on the evaluation days",
             title=f"T = {length} day(s) a period, each warm-started from the last")
    _legend(axis)
  for axis in panels[len(lengths):]:
    axis.set_axis_off()
  return figure


def _step_time(report: dict, plt):
  figure, (steps, throughput) = plt.subplots(1, 2, figsize=(15, 5.5))
  for trainer in dict.fromkeys(r["trainer"] for r in report["bench"]["results"]):
    rows = [r for r in report["bench"]["results"]
            if r["trainer"] == trainer and "seconds_per_step" in r]
    steps.plot([r["vocab"] for r in rows], [r["seconds_per_step"] for r in rows],
               marker=ALGORITHM_MARKERS.get(_TRAINER_ALGORITHM.get(trainer, trainer), "o"),
               color=ALGORITHM_COLORS.get(_TRAINER_ALGORITHM.get(trainer, trainer)),
               label=trainer)
  steps.set(xscale="log", yscale="log", xlabel="vocabulary size", ylabel="seconds per step",
            title="Table 4 analogue: one table, dim 64, batch 1024, "
                  f"{report['bench']['optimizer']} (timing only)")
  _legend(steps)
  for algorithm in dict.fromkeys(p["algorithm"] for p in report["points"]):
    rows = [p for p in report["points"] if p["algorithm"] == algorithm]
    throughput.plot([p["vocabulary_scale"] for p in rows],
                    [p["examples_per_second"] for p in rows],
                    marker=ALGORITHM_MARKERS.get(algorithm, "o"),
                    color=ALGORITHM_COLORS.get(algorithm), label=algorithm)
    steady = [p for p in rows if p.get("examples_per_second_after_first_step")]
    if steady:
      throughput.plot([p["vocabulary_scale"] for p in steady],
                      [p["examples_per_second_after_first_step"] for p in steady],
                      marker=ALGORITHM_MARKERS.get(algorithm, "o"), linestyle="--",
                      fillstyle="none", color=ALGORITHM_COLORS.get(algorithm),
                      label=f"{algorithm}, after the first step")
    for row in rows:
      throughput.annotate(f"AUC {row['auc_mean']:.3f}", (row["vocabulary_scale"],
                                                         row["examples_per_second"]),
                          textcoords="offset points", xytext=(5, 3), fontsize=7)
  for line, scale in enumerate(report.get("not_run", [])):
    throughput.text(0.0, -0.16 - 0.06 * line,
                    f"x{scale['vocabulary_scale']:g} {', '.join(scale['algorithms'])} "
                    f"not run: {scale['reason']}",
                    transform=throughput.transAxes, fontsize=7, va="top", wrap=True)
  throughput.set(xscale="log", xlabel="vocabulary scale (x Table 3)",
                 ylabel="examples / second (fit wall time)",
                 title="pCTR job throughput (dashed: after the first step)")
  _legend(throughput)
  return figure


_TRAINER_ALGORITHM = {"nonprivate": "none"}  # `sparse-dp bench step` trainers' algorithms

_FIGURES = {"tradeoffs": _tradeoffs, "epsilon": _epsilon, "heatmap": _heatmap,
            "streaming": _streaming, "step-time": _step_time}


def figure(report: dict):
  """The report's figure (a matplotlib ``Figure``; close it when done)."""
  plt = _pyplot()
  drawn = _FIGURES[report["study"]](report, plt)
  drawn.set_dpi(DPI)  # laid out and labels placed at the dpi it is saved at
  scale = scale_text(report)
  if scale:
    drawn.text(0.5, 0.0, scale, ha="center", va="bottom", fontsize=9)
  drawn.tight_layout(rect=(0, 0.04, 1, 1))
  _place_labels(drawn)  # on the final layout
  return drawn


def save(report: dict, json_path: pathlib.Path, png_path: pathlib.Path) -> None:
  """Draws the report as written to ``json_path`` into ``png_path``, stamped with its hash."""
  digest = hashlib.sha256(pathlib.Path(json_path).read_bytes()).hexdigest()
  drawn = figure(report)
  drawn.savefig(png_path, dpi=DPI, bbox_inches="tight",
                metadata={"Source": f"{pathlib.Path(json_path).name} sha256={digest}"})
  _pyplot().close(drawn)
