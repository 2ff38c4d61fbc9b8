"""The pCTR job's calibration metrics (``sparse_dp.models.calibration``) on a hand-computed case."""

import numpy as np
import pytest

from sparse_dp.models.calibration import (
  Reliability,
  base_rate_log_loss,
  calibration_metrics,
  log_loss,
)

# Five predictions in 10 equal-width bins: 0.05 -> bin 0, 0.15 (twice) -> bin 1,
# 0.55 -> bin 5, 0.95 -> bin 9.
P = np.array([0.05, 0.15, 0.15, 0.55, 0.95])
Y = np.array([0.0, 0.0, 1.0, 1.0, 1.0])


def test_reliability_bins_by_hand():
  table = Reliability.of(P, Y, bins=10)
  assert table.count.tolist() == [1, 2, 0, 0, 0, 1, 0, 0, 0, 1]
  filled = table.count > 0
  assert table.mean_predicted[filled] == pytest.approx([0.05, 0.15, 0.55, 0.95])
  assert table.observed_rate[filled] == pytest.approx([0.0, 0.5, 1.0, 1.0])
  assert np.isnan(table.mean_predicted[~filled]).all()
  # (1 x 0.05 + 2 x 0.35 + 1 x 0.45 + 1 x 0.05) / 5
  assert table.expected_calibration_error == pytest.approx(0.25)


def test_bin_edges_and_a_calibrated_table():
  # A prediction on an edge goes to the bin above it; 1.0 goes to the last bin.
  table = Reliability.of([0.0, 0.5, 1.0], [0, 1, 1], bins=2)
  assert table.count.tolist() == [1, 2]
  assert Reliability.of([0.25, 0.25, 0.25, 0.25], [0, 1, 0, 0], 4).expected_calibration_error == 0


def test_log_losses_and_the_job_metrics_by_hand():
  logits = np.log(P / (1 - P))
  expected = -np.mean(Y * np.log(P) + (1 - Y) * np.log(1 - P))
  assert log_loss(logits, Y) == pytest.approx(expected)
  assert base_rate_log_loss(Y) == pytest.approx(-(0.6 * np.log(0.6) + 0.4 * np.log(0.4)))
  assert base_rate_log_loss([1, 1]) == 0.0
  metrics, table = calibration_metrics(logits[:, None], Y[:, None])
  assert metrics == pytest.approx({
      "logloss": expected, "base_rate_logloss": base_rate_log_loss(Y), "ece": 0.25,
      "ece_bins": 10, "mean_predicted": P.mean(), "observed_rate": 0.6})
  assert table.count.sum() == 5


def test_bad_inputs_are_refused_by_name():
  with pytest.raises(ValueError, match="one length"):
    Reliability.of([0.5, 0.5], [1])
  with pytest.raises(ValueError, match="bins must be >= 1"):
    Reliability.of([0.5], [1], bins=0)


def test_the_reliability_diagram_is_written(tmp_path):
  Reliability.of(P, Y).plot(tmp_path / "reliability.png")
  assert (tmp_path / "reliability.png").stat().st_size > 0
