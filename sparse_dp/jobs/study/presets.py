"""Named sizes of the studies: ``smoke`` (CI, minutes) and ``full`` (the committed results).

The smoke preset's sweeps share points (the epsilon sweep's and the heatmap's
first points are the trade-off study's; the throughput's first scale is the
sweeps' data), so in one output folder they train each run once. A preset fixes
everything a study varies or holds constant, so a report is
reproduced by its study name, preset and data. The ``full`` preset is sized to
run the four other studies in about 40 minutes on a 2-core CPU machine: synthetic
Criteo at 5% of the Table-3 vocabulary sizes, the eight largest categorical
features (the ones that hold the rows DP-SGD's dense noise touches), a narrow
dense tower, and two seeds per point; its step-time study trains the same model
on as many examples at 1x, 10x and 100x the Table-3 vocabularies (its time in
``docs/results.md``). The paper's own scale (45M examples, all
26 features, 598x4 units) is out of reach of a CPU; the shapes, not the
values, are what these presets reproduce.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

# DP-FEST's top-k selection spends epsilon_1 = 0.01 of the total (Ghazi et al.,
# NeurIPS 2023, App. B.1:
# "We set epsilon = 0.01 ... and deduct the value from the total privacy budget"),
# at the studies' epsilon of 1 a share of 0.01.
PAPER_SELECTION_SHARE = 0.01

# Synthetic examples of the paper preset, sized on seed 0, where DP-SGD at epsilon 8 is
# within 0.02 of the non-private model's AUC; over all 5 seeds, at one epoch, it is not,
# nor at 2,000,000 or 8,000,000 examples, where the preset's Adam leaves DP-SGD further
# behind and row-wise Adagrad narrows the gap to 0.024 (docs/paper_study.md, Results).
PAPER_EXAMPLES = 100_000

# The eight largest categorical features of Table 3 (0-based), largest first.
LARGEST_FEATURES = (2, 11, 20, 15, 23, 3, 25, 9)


@dataclasses.dataclass(frozen=True)
class StudyPreset:
  """Sizes and sweeps of every study (``tau_sigmas``: AdaFEST thresholds in units of
  the contribution map's noise ``sigma1 C1``; ``fest_ks``: DP-FEST buckets per table)."""

  name: str
  # Data and model of the pCTR sweeps (tradeoffs, epsilon, heatmap).
  examples: int  # synthetic lines written
  max_examples: Optional[int]  # lines read of --data (None: every line of real files)
  synthetic_scale: float
  features: Optional[tuple[int, ...]]  # None: all 26
  hidden_units: tuple[int, ...]
  batch_size: int
  epochs: float
  learning_rate: float
  seeds: tuple[int, ...]
  # DP-FEST / DP-AdaFEST+: share of epsilon spent on the top-k (``--selection-share``).
  selection_share: float
  # Sweeps; the first value of each is the algorithm's default point.
  epsilon: float
  fest_ks: tuple[int, ...]
  tau_sigmas: tuple[float, ...]
  sigma_ratios: tuple[float, ...]
  adafest_plus: tuple[tuple[int, float], ...]  # (k, tau_sigmas) pairs
  epsilons: tuple[float, ...]
  epsilon_algorithms: tuple[str, ...]
  # Streaming (``sparse-dp stream``).
  stream_train_days: str
  stream_eval_days: str
  stream_period: int
  stream_examples_per_day: int
  stream_eval_examples_per_day: int
  streams: tuple[tuple[str, str], ...]  # (algorithm, DP-FEST frequency source)
  # Step time (``sparse-dp bench step``) and pCTR throughput by vocabulary scale.
  bench_vocabularies: tuple[int, ...]
  bench_trainers: tuple[str, ...]
  bench_steps: int
  throughput_scales: tuple[float, ...]
  throughput_examples: int
  throughput_algorithms: tuple[str, ...]
  # The paper preset's protocol (Ghazi et al., NeurIPS 2023, §4.1, App. D.1.1); the defaults are the
  # smoke and full presets' (one data set for every seed, one held-out split).
  version: int = 1  # part of every cached run's key: bump it when a run's meaning changes
  # ``--optimizer`` of every pCTR run and stream (``learning_rate`` is its step size);
  # ``sparse-dp study --optimizer`` replaces it.
  optimizer: str = "adam"
  # C2 of every study run (the job's default), part of the cache key.
  l2_norm_clip: float = 1.0
  resample_data: bool = False  # synthetic data drawn anew per seed (generator seed = seed)
  test_split: bool = False  # held-out halves: validation picks points, test reports them
  taus: tuple[float, ...] = ()  # absolute AdaFEST thresholds (``--tau``), beside tau_sigmas
  contribution_clips: tuple[float, ...] = ()  # C1 values (``--contribution-clip``)
  refine: bool = False  # finer grids around the coarse frontier (sweeps.refined_points)
  # DP-FEST points (k, selection share) beside the sweep at ``selection_share``: at the
  # paper's 0.01 of epsilon 1 and 90,000 training examples the top-k's Gumbel noise
  # (scale k x tables / epsilon_1) is above every count, so the top-k is noise.
  fest_shares: tuple[tuple[int, float], ...] = ()
  # Streaming period lengths (days, Fig. 5's T), each stream run at every one; empty:
  # ``stream_period`` alone.
  stream_periods: tuple[int, ...] = ()
  # The streams' tables: the first K categorical features (``--categorical-features``);
  # None: all 26.
  stream_features: Optional[int] = None

  def describe(self) -> dict:
    return dataclasses.asdict(self)


SMOKE = StudyPreset(
    name="smoke", examples=300, max_examples=None, synthetic_scale=0.01,
    features=LARGEST_FEATURES[:2],
    hidden_units=(8,), batch_size=64, epochs=1.0, learning_rate=1e-2, seeds=(0,),
    selection_share=PAPER_SELECTION_SHARE,
    epsilon=1.0, fest_ks=(20,), tau_sigmas=(2.0, 6.0), sigma_ratios=(2.0,),
    adafest_plus=((20, 2.0),), epsilons=(1.0, 4.0), epsilon_algorithms=("adafest",),
    stream_train_days="0", stream_eval_days="1", stream_period=1,
    stream_examples_per_day=200, stream_eval_examples_per_day=100,
    streams=(("fest", "first-day"), ("fest", "running")), stream_features=2,
    bench_vocabularies=(1_000,), bench_trainers=("dpsgd", "adafest"), bench_steps=2,
    throughput_scales=(0.01, 0.1), throughput_examples=300,
    throughput_algorithms=("adafest",))

FULL = StudyPreset(
    name="full", examples=60_000, max_examples=None, synthetic_scale=0.05,
    features=LARGEST_FEATURES,
    hidden_units=(32,), batch_size=1024, epochs=3.0, learning_rate=1e-2, seeds=(0, 1),
    selection_share=PAPER_SELECTION_SHARE,
    epsilon=1.0, fest_ks=(2000, 200), tau_sigmas=(2.0, 6.0), sigma_ratios=(2.0, 5.0),
    adafest_plus=((2000, 2.0),), epsilons=(0.5, 1.0, 2.0, 4.0, 8.0),
    epsilon_algorithms=("dpsgd", "fest", "adafest", "adafest+"),
    stream_train_days="0-1", stream_eval_days="2", stream_period=1,
    stream_examples_per_day=20_000, stream_eval_examples_per_day=5_000,
    streams=(("adafest", "running"), ("fest", "first-day"), ("fest", "all-days"),
             ("fest", "running")),
    bench_vocabularies=(100_000, 1_000_000, 10_000_000),
    bench_trainers=("nonprivate", "dpsgd", "adafest"), bench_steps=5,
    # As many examples as the sweeps: on 5,000 (13 steps) the runs ended inside the
    # training transient, at AUC 0.42 (docs/paper_study.md).
    throughput_scales=(1.0, 10.0, 100.0), throughput_examples=60_000,
    throughput_algorithms=("dpsgd", "adafest"))

# The paper's Criteo-Kaggle setting (Ghazi et al., NeurIPS 2023, §4.1, App. D.1.1): all 26
# features at the Table-3 vocabularies (338,834 rows once hashed), 598x4 ReLU tower, batch 2,048,
# epsilon 1 with delta 1/N, 5 seeds each on its own synthetic draw. Sized in
# docs/paper_study.md (measured examples and seconds per point on a 2-core machine).
PAPER = StudyPreset(
    name="paper", examples=PAPER_EXAMPLES, max_examples=None, synthetic_scale=1.0,
    features=None, hidden_units=(598,) * 4, batch_size=2048, epochs=1.0,
    learning_rate=1e-2, seeds=(0, 1, 2, 3, 4), selection_share=PAPER_SELECTION_SHARE,
    epsilon=1.0, fest_ks=(1_000, 100, 10_000, 300_000),
    tau_sigmas=(2.0, 8.0), sigma_ratios=(5.0, 0.1, 1.0, 10.0),
    adafest_plus=((1_000, 2.0), (10_000, 2.0)),
    epsilons=(1.0, 8.0), epsilon_algorithms=("dpsgd", "fest", "adafest", "adafest+"),
    stream_train_days="0-17", stream_eval_days="18-23", stream_period=1,
    stream_examples_per_day=PAPER_EXAMPLES // 18, stream_eval_examples_per_day=2_000,
    streams=(("adafest", "running"), ("fest", "first-day"), ("fest", "all-days"),
             ("fest", "running")),
    bench_vocabularies=(100_000, 1_000_000, 10_000_000),
    bench_trainers=("nonprivate", "dpsgd", "adafest"), bench_steps=5,
    throughput_scales=(1.0,), throughput_examples=PAPER_EXAMPLES,
    throughput_algorithms=("dpsgd", "adafest"),
    version=1, resample_data=True, test_split=True, taus=(1.0, 10.0, 100.0),
    contribution_clips=(1.0, 5.0, 10.0), fest_shares=((10, 0.5),), refine=True,
    stream_periods=(1, 2, 3))

PRESETS = {p.name: p for p in (SMOKE, FULL, PAPER)}


def preset(name: str) -> StudyPreset:
  if name not in PRESETS:
    raise ValueError(f"--preset {name!r}: choose from {', '.join(PRESETS)}")
  return PRESETS[name]
