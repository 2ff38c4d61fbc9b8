"""Markdown tables of a study's JSON report (what the notebooks and the README show)."""

from __future__ import annotations

from sparse_dp.jobs.study.reports.claims import claims


def _number(value, digits: int = 4) -> str:
  if value is None:
    return "-"
  if isinstance(value, float) and abs(value) >= 1000:
    return f"{value:,.0f}"
  return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _table(header: list[str], rows: list[list]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(_number(c) if not isinstance(c, str) else c for c in row) + " |"
            for row in rows]
  return "\n".join(lines)


def auc_cell(point: dict) -> str:
  return f"{point['auc_mean']:.4f} ± {point['auc_std']:.4f} (n={len(point['auc'])})"


def reduction_cell(point: dict) -> str:
  return (f"{_number(point['gradient_size_reduction'])} ± "
          f"{_number(point['gradient_size_reduction_std'])}")


def interval_cell(paired) -> str:
  """A paired difference from DP-SGD: mean [95% t interval] over seeds."""
  if not paired:
    return "-"
  if paired["low"] is None:
    return f"{paired['mean']:+.4f} (n=1)"
  return f"{paired['mean']:+.4f} [{paired['low']:+.4f}, {paired['high']:+.4f}] (n={paired['n']})"


def points_table(points: list[dict], extra: tuple[str, ...] = ()) -> str:
  """One row per point: AUC mean ± sd over seeds, epsilon, gradient-size reduction;
  with a test split, the validation AUC, the test AUC and its paired difference from
  DP-SGD's (mean and 95% t interval over seeds)."""
  tested = any("test_auc_mean" in p for p in points)
  header = ["point", *extra, "target ε", "ε spent",
            "validation AUC (mean ± sd)" if tested else "AUC (mean ± sd over seeds)",
            *(["test AUC", "test AUC - DP-SGD's (paired, 95%)"] if tested else []),
            "gradient-size reduction", "examples/s"]
  return _table(header, [[p["label"], *(p.get(key) for key in extra), p.get("epsilon"),
                          p["epsilon_spent"], auc_cell(p),
                          *([_number(p.get("test_auc_mean")),
                             interval_cell(p.get("test_auc_vs_dpsgd"))] if tested else []),
                          reduction_cell(p), p.get("examples_per_second")] for p in points])


def _missing(report: dict) -> str:
  missing = report.get("missing") or []
  return (f"\n\nNot yet in the run cache ({len(missing)} point"
          f"{'' if len(missing) == 1 else 's'}): " + "; ".join(missing)
          if missing else "")


def _tradeoffs(report: dict) -> str:
  thresholds = sorted({r["auc_loss_threshold"] for r in report["best_reduction"]})
  algorithms = list(dict.fromkeys(r["algorithm"] for r in report["best_reduction"]))
  best = {(r["algorithm"], r["auc_loss_threshold"]): r for r in report["best_reduction"]}
  rows = [[a] + [_best_cell(best[(a, t)]) for t in thresholds] for a in algorithms]
  return (points_table(report["points"]) + "\n\nBest gradient-size reduction within an AUC "
          "loss of DP-SGD's mean (validation) AUC (Fig. 3; '-': no point that close; "
          "[ ]: the point's test AUC minus DP-SGD's, paired over seeds, 95%):\n\n"
          + _table(["algorithm"] + [f"loss ≤ {t:g}" for t in thresholds], rows)
          + _missing(report))


def _best_cell(row: dict) -> str:
  if row["gradient_size_reduction"] is None:
    return "-"
  paired = row.get("test_auc_vs_dpsgd")
  return _number(row["gradient_size_reduction"]) + (f" {interval_cell(paired)}" if paired else "")


def _heatmap(report: dict) -> str:
  cell = {(p["sigma_ratio"], p["tau_sigmas"]): p for p in report["points"]}
  header = ["σ1/σ2 \\ τ (σ1·C1)"] + [f"{t:g}" for t in report["tau_sigmas"]]
  grids = []
  for title, text in (("AUC (mean ± sd)", auc_cell), ("gradient-size reduction", reduction_cell)):
    rows = [[f"{r:g}"] + [text(cell[(r, t)]) if (r, t) in cell else "-"
                          for t in report["tau_sigmas"]]
            for r in report["sigma_ratios"]]
    grids.append(f"{title}, DP-AdaFEST at ε={report['epsilon']:g}:\n\n" + _table(header, rows))
  return "\n\n".join(grids) + _missing(report)


def _streaming(report: dict) -> str:
  rows = [[p["label"], r["period"], ",".join(map(str, r["days"])), r["epsilon_spent"],
           auc_cell(r), _number(r["gradient_size_reduction"])]
          for p in report["points"] for r in p["periods"]]
  return (points_table(report["points"]) + "\n\nEach period:\n\n"
          + _table(["stream", "period", "days", "ε spent so far", "AUC (mean ± sd)",
                    "gradient-size reduction"], rows) + _missing(report))


def _step_time(report: dict) -> str:
  trainers = list(dict.fromkeys(r["trainer"] for r in report["bench"]["results"]))
  rows = [[row["vocab"]] + [row.get(t) for t in trainers] + [row.get("reduction_factor")]
          for row in report["table4"]]
  return (f"Seconds per step (median), one table of dim 64, batch 1024, "
          f"{report['bench']['optimizer']} (Table 4, `sparse-dp bench step`):\n\n"
          + _table(["vocabulary"] + trainers + ["dpsgd / adafest"], rows)
          + "\n\npCTR job by vocabulary scale:\n\n"
          + points_table(report["points"], extra=("vocabulary_scale", "table_rows"))
          + _after_first_step(report["points"]) + _not_run(report.get("not_run", []))
          + _missing(report))


def _after_first_step(points: list[dict]) -> str:
  """The steady rate beside the whole ``fit``'s (runs cached before it was measured: none)."""
  if not any(p.get("first_step_seconds") is not None for p in points):
    return ""
  return ("\n\nThroughput: examples/s above is over the whole `fit`, its first step "
          "included (tracing the train function); after the first step:\n\n"
          + _table(["point", "vocabulary_scale", "first step (s)", "examples/s after it"],
                   [[p["label"], p["vocabulary_scale"], p.get("first_step_seconds"),
                     p.get("examples_per_second_after_first_step")] for p in points]))


def _not_run(scales: list[dict]) -> str:
  if not scales:
    return ""
  rows = [[s["vocabulary_scale"], s["table_rows"], ", ".join(s["algorithms"]), s["reason"]]
          for s in scales]
  return ("\n\nNot run (memory, decided before training):\n\n"
          + _table(["vocabulary_scale", "table_rows", "points", "why"], rows))


_TABLES = {"tradeoffs": _tradeoffs, "heatmap": _heatmap, "streaming": _streaming,
           "step-time": _step_time,
           "epsilon": lambda report: points_table(report["points"]) + _missing(report)}


def _trained_with(report: dict) -> str:
  """The runs' optimizer and learning rate (reports written before the presets named an
  optimizer trained with Adam and show none)."""
  preset = report.get("preset") or {}
  if "optimizer" not in preset:
    return ""
  own = sorted({name for point in report.get("points", [])
                for name, _ in point.get("flags", []) if name in ("optimizer", "learning_rate")})
  return (f"Trained with `--optimizer {preset['optimizer']} --learning-rate "
          f"{preset['learning_rate']:g}`"
          + (f", except where a point's label gives its own {' and '.join(own)}" if own else "")
          + ".\n\n")


def markdown(report: dict) -> str:
  """The report's tables, opened by the runs' optimizer and closed by whether the paper's
  claims hold here (:mod:`sparse_dp.jobs.study.reports.claims`)."""
  lines = claims(report)
  verdict = ("\n\nThe paper's claims here (computed from this report):\n\n"
             + "\n".join(f"- {line}" for line in lines)) if lines else ""
  return _trained_with(report) + _TABLES[report["study"]](report) + verdict + "\n"
