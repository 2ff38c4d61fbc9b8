"""The streaming claims' verdicts (Fig. 5 / §4.3), from reports built by hand."""

import re

from sparse_dp.jobs.study.reports.claims import claims


def stream(algorithm, aucs, reduction=20.0, source=None):
  label = algorithm if source is None else f"{algorithm} ({source})"
  return {"algorithm": algorithm, "fest_frequencies": source, "label": label, "auc": aucs,
          "auc_mean": sum(aucs) / len(aucs), "gradient_size_reduction": reduction}


def verdicts(*points):
  lines = claims({"study": "streaming", "points": list(points)})
  return [re.findall(r"(?:\(|; )(holds|does not hold|undecided)\b", line)[-1] for line in lines]


def sources(running, first_day, all_days):
  return verdicts(stream("fest", running, source="running"),
                  stream("fest", first_day, source="first-day"),
                  stream("fest", all_days, source="all-days"))


def test_running_counts_are_judged_by_their_paired_interval():
  # Above the first day's (interval above 0), within 0.005 of all days' (above -0.005).
  assert sources([0.72, 0.73, 0.74], [0.70, 0.71, 0.72], [0.721, 0.731, 0.741]) == [
      "holds", "holds"]
  # Below both: the intervals lie under 0 and under -0.005.
  assert sources([0.70, 0.71, 0.72], [0.72, 0.73, 0.74], [0.72, 0.73, 0.74]) == [
      "does not hold", "does not hold"]
  # Seeds that disagree: the intervals contain the margins.
  assert sources([0.70, 0.74, 0.71], [0.72, 0.71, 0.73], [0.72, 0.71, 0.73]) == [
      "undecided", "undecided"]
  # One seed, however far apart: no interval.
  assert sources([0.75], [0.70], [0.75]) == ["undecided", "undecided"]


def test_streams_near_chance_leave_every_comparison_undecided():
  assert sources([0.53, 0.54, 0.53], [0.50, 0.51, 0.50], [0.53, 0.54, 0.53]) == [
      "undecided", "undecided"]
  lines = claims({"study": "streaming", "points": [
      stream("adafest", [0.52, 0.53], reduction=44.0),
      stream("fest", [0.53, 0.54], reduction=20.0, source="first-day")]})
  assert ("2.2x the reduction (undecided: adafest is at AUC 0.5250, within 0.05 of chance"
          in lines[0])


def test_adafest_is_compared_with_the_sparsest_fest_stream_of_no_lower_auc():
  fest = [stream("fest", [0.73], reduction=20.0, source="all-days"),
          stream("fest", [0.70], reduction=100.0, source="first-day")]  # below: not a rival
  assert verdicts(stream("adafest", [0.72], reduction=44.0), *fest)[-1] == "holds"
  assert verdicts(stream("adafest", [0.72], reduction=30.0), *fest)[-1] == "does not hold"
  lines = claims({"study": "streaming", "points": [stream("adafest", [0.75]), *fest]})
  assert "no DP-FEST stream at its AUC" in lines[-1]
