"""Calibration of the pCTR model's held-out predictions: is a predicted 0.3 a 30% click rate?

For held-out logits ``z_i`` and labels ``y_i`` (``p_i = sigmoid(z_i)``, ``n`` examples):

* log-loss ``-1/n sum_i [y_i log p_i + (1 - y_i) log(1 - p_i)]``;
* the base-rate predictor's log-loss ``-[r log r + (1 - r) log(1 - r)]``, ``r = mean(y)``,
  the least a useful model must beat (computed from the evaluation labels, like AUC);
* a reliability table over ``B`` equal-width bins of ``p`` (bin ``b`` holds
  ``b/B <= p < (b+1)/B``, the last one includes 1): each bin's count ``n_b``, mean
  prediction ``p_b`` and observed click rate ``y_b``;
* the expected calibration error ``ECE = sum_b (n_b / n) |p_b - y_b|`` (Naeini, Cooper &
  Hauskrecht, AAAI 2015; Guo et al., ICML 2017), over the non-empty bins.

Computed on the host (NumPy) from the evaluation's logits, like the job's AUC. See
docs/calibration.md.
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np

RELIABILITY_BINS = 10


@dataclasses.dataclass(frozen=True)
class Reliability:
  """Equal-width bins of predicted probability; empty bins have ``count`` 0 and NaN means."""

  edges: np.ndarray  # [B + 1]: 0, 1/B, ..., 1
  count: np.ndarray  # [B] examples per bin
  mean_predicted: np.ndarray  # [B] mean p in the bin
  observed_rate: np.ndarray  # [B] mean label in the bin

  @classmethod
  def of(cls, probabilities, labels, bins: int = RELIABILITY_BINS) -> "Reliability":
    """Bins ``probabilities`` (in [0, 1]) with their 0/1 ``labels``."""
    p = np.asarray(probabilities, np.float64).ravel()
    y = np.asarray(labels, np.float64).ravel()
    if p.shape != y.shape or p.size == 0:
      raise ValueError(f"probabilities and labels must be two non-empty vectors of one length, "
                       f"got {p.size} and {y.size}")
    if bins < 1:
      raise ValueError(f"bins must be >= 1, got {bins}")
    index = np.minimum((p * bins).astype(np.int64), bins - 1)
    count = np.bincount(index, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
      mean_predicted = np.bincount(index, p, bins) / count
      observed_rate = np.bincount(index, y, bins) / count
    return cls(np.linspace(0.0, 1.0, bins + 1), count, mean_predicted, observed_rate)

  @property
  def expected_calibration_error(self) -> float:
    """``sum_b (n_b / n) |p_b - y_b|`` over the non-empty bins."""
    filled = self.count > 0
    gaps = np.abs(self.mean_predicted[filled] - self.observed_rate[filled])
    return float(np.sum(self.count[filled] * gaps) / np.sum(self.count))

  def plot(self, path: pathlib.Path, title: str = "") -> None:
    """The reliability diagram: observed click rate against mean prediction per bin,
    the diagonal (perfect calibration) and, below, the examples per bin."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, (rates, counts) = plt.subplots(2, 1, figsize=(5, 6), sharex=True,
                                           gridspec_kw={"height_ratios": [3, 1]})
    filled = self.count > 0
    rates.plot([0, 1], [0, 1], color="grey", linestyle="--", label="calibrated")
    rates.plot(self.mean_predicted[filled], self.observed_rate[filled], marker="o",
               label="model")
    rates.set(ylabel="observed click rate", xlim=(0, 1), ylim=(0, 1))
    rates.set_title(title or f"ECE {self.expected_calibration_error:.4f}", fontsize="medium")
    rates.legend(loc="upper left")
    widths = np.diff(self.edges)
    counts.bar(self.edges[:-1], self.count, width=widths, align="edge", edgecolor="black")
    counts.set(xlabel=f"predicted click probability ({len(self.count)} equal-width bins)",
               ylabel="examples")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def log_loss(logits, labels) -> float:
  """Mean binary cross-entropy of ``sigmoid(logits)``, computed from the logits (stable)."""
  z = np.asarray(logits, np.float64).ravel()
  y = np.asarray(labels, np.float64).ravel()
  return float(np.mean(np.logaddexp(0.0, z) - y * z))


def base_rate_log_loss(labels) -> float:
  """The log-loss of predicting the labels' mean ``r`` for every example (0 if ``r`` is 0 or 1)."""
  r = float(np.mean(np.asarray(labels, np.float64)))
  return float(-sum(v * np.log(v) for v in (r, 1.0 - r) if v > 0))


def calibration_metrics(logits, labels,
                        bins: int = RELIABILITY_BINS) -> tuple[dict, Reliability]:
  """The job's calibration metrics of held-out ``logits`` and their reliability table."""
  z = np.asarray(logits, np.float64).ravel()
  probabilities = 1.0 / (1.0 + np.exp(-z))
  reliability = Reliability.of(probabilities, labels, bins)
  metrics = {
      "logloss": log_loss(z, labels),
      "base_rate_logloss": base_rate_log_loss(labels),
      "ece": reliability.expected_calibration_error,
      "ece_bins": bins,
      "mean_predicted": float(np.mean(probabilities)),
      "observed_rate": float(np.mean(np.asarray(labels, np.float64))),
  }
  return metrics, reliability
