"""Checks that a study's figure shows what its JSON report holds (the study and
notebook tests)."""

import hashlib
import itertools
import json
import pathlib

import pytest
from matplotlib.text import Text
from PIL import Image

from sparse_dp.jobs.study.reports import plots


def plotted_errorbars(figure) -> list[tuple[float, float, float]]:
  """``(x, y, half height of the y error bar)`` of every error-bar point of ``figure``."""
  points = []
  for axis in figure.axes:
    for container in axis.containers:
      line, _, bar_collections = container.lines
      assert container.has_yerr  # Axes.errorbar draws x errors first, y errors last
      vertical = bar_collections[-1].get_segments()
      for x, y, segment in zip(line.get_xdata(), line.get_ydata(), vertical):
        points.append((float(x), float(y), float(segment[1][1] - segment[0][1]) / 2))
  return points


def assert_point_labels_apart(figure) -> None:
  """No two point labels of an axis overlap as drawn, and each lies inside its axis."""
  figure.canvas.draw()
  renderer = figure.canvas.get_renderer()
  for axis in figure.axes:
    frame = axis.get_window_extent(renderer)
    boxes = [(t.get_text(), Text.get_window_extent(t, renderer)) for t in axis.texts
             if t.get_gid() == plots.POINT_LABEL]  # the texts, without their lines
    for (one, a), (other, b) in itertools.combinations(boxes, 2):
      assert not (a.x0 < b.x1 - 0.5 and b.x0 < a.x1 - 0.5 and a.y0 < b.y1 - 0.5
                  and b.y0 < a.y1 - 0.5), (axis.get_title(), one, other)
    for text, box in boxes:
      assert (frame.x0 - 0.5 <= box.x0 and box.x1 <= frame.x1 + 0.5
              and frame.y0 - 0.5 <= box.y0 and box.y1 <= frame.y1 + 0.5), (axis.get_title(), text)


def assert_figure_matches_report(json_path: pathlib.Path, png_path: pathlib.Path) -> None:
  """The PNG is stamped with the JSON's hash, and the figure drawn from the JSON shows
  its scale, every point's configuration (a heatmap: every cell's value), and error
  bars at the points' numbers (AUC ± spread; Fig. 3: reduction ± spread)."""
  digest = hashlib.sha256(json_path.read_bytes()).hexdigest()
  assert Image.open(png_path).text["Source"] == f"{json_path.name} sha256={digest}"
  report = json.loads(json_path.read_text())
  figure = plots.figure(report)
  texts = {text.get_text() for axis in figure.axes for text in axis.texts}
  texts |= {text.get_text() for text in figure.texts}
  if plots.scale_text(report):
    assert plots.scale_text(report) in texts
  if report["study"] == "heatmap":
    for point in report["points"]:
      assert f"{point['auc_mean']:.3f}" in texts, point
  # A tradeoffs figure of data drawn per seed shows AUCs paired with DP-SGD's, the
  # non-private point in the title.
  paired = report["study"] == "tradeoffs" and plots.paired_with_dpsgd(report)
  drawn = [p for p in report["points"] if not (paired and p["algorithm"] == "none")]
  # Each point labelled with its configuration, or in a scatter of many points with a
  # number that a key gives with the point's label.
  numbered = report["study"] == "tradeoffs" and len(report["points"]) > plots.MAX_LABELLED_POINTS
  if report["study"] in ("tradeoffs", "epsilon"):
    for point in drawn:
      expected = point["label"] if numbered else plots.configuration(point)
      assert not expected or expected in texts, point
  if numbered:  # the scatter's points numbered 1..n, as the key numbers them
    numbers = [t.get_text() for t in figure.axes[0].texts if t.get_gid() == plots.POINT_LABEL]
    assert sorted(numbers, key=int) == [str(i + 1) for i in range(len(drawn))]
  assert_point_labels_apart(figure)
  expected = [(p["gradient_size_reduction"], *plots._auc_bar(p, paired))
              for p in drawn]
  expected += [(max(r["days"]), r["auc_mean"], r["auc_std"])  # at the period's last day
               for p in report["points"] for r in p.get("periods", [])]
  expected += [(r["auc_loss_threshold"], r["gradient_size_reduction"],
                r.get("gradient_size_reduction_std") or 0.0)
               for r in report.get("best_reduction", [])
               if r["gradient_size_reduction"] is not None]
  bars = plotted_errorbars(figure)
  if report["study"] in ("tradeoffs", "epsilon", "streaming"):
    assert len(bars) >= len(drawn)
  for bar in bars:
    assert any(bar == pytest.approx(e, rel=1e-9, abs=1e-12) for e in expected), bar
  plots._pyplot().close(figure)


def report_point(algorithm, auc, reduction, label=None, std=0.01, epsilon=1.0):
  """A point of a study report, as a sweep writes it."""
  return {"algorithm": algorithm, "label": label or algorithm, "auc": [auc - std, auc + std],
          "auc_mean": auc, "auc_std": std, "epsilon": epsilon, "epsilon_spent": epsilon,
          "gradient_size_reduction": reduction, "gradient_size_reduction_std": reduction / 10,
          "examples_per_second": 100.0, "fest_k": None, "tau_sigmas": None, "sigma_ratio": None}
