# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Streaming periods and DP-FEST's frequency sources (Ghazi et al., NeurIPS 2023, §4.3, Fig. 5)
#
# `sparse-dp stream` retrains the pCTR model period by period on the training days
# under one budget, each period warm-started from the previous one and evaluated on
# the evaluation days. DP-AdaFEST adapts its rows per batch; DP-FEST's top-k counts the
# first training day (`first-day`) or every day up to the period (`running`). The
# paper: running counts are almost as good as all days' and much better than the first
# day's, and DP-AdaFEST reaches more than twice DP-FEST's reduction at the same AUC.
# Each point is a stream repeated over seeds (the synthetic days, which drift, and the
# initial weights); its AUC is the last period's.
#
# Parameters (environment variables): `SPARSE_DP_STUDY_PRESET` (`smoke`: minutes, for CI;
# `full`: the results committed under `benchmarks/results/study`), `SPARSE_DP_STUDY_DATA`
# (`synthetic`, or a glob of Criteo files), `SPARSE_DP_STUDY_OUT` (output folder; each
# finished stream is cached in `OUT/streams`, so a rerun resumes), `SPARSE_DP_STUDY_FROM_CACHE`
# (`1`: train nothing, draw the finished streams), `SPARSE_DP_STUDY_OPTIMIZER` and
# `SPARSE_DP_STUDY_LEARNING_RATE` (every run's; unset: the preset's). The same study runs
# from the shell: `sparse-dp study streaming --preset full --out DIR [--from-cache]
# [--optimizer NAME --learning-rate LR]`; the `paper` preset runs every stream at T = 1, 2
# and 3 days a period.

# %% tags=["parameters"]
import os

PRESET = os.environ.get("SPARSE_DP_STUDY_PRESET", "smoke")
DATA = os.environ.get("SPARSE_DP_STUDY_DATA", "synthetic")
OUT = os.environ.get("SPARSE_DP_STUDY_OUT", "study-results")
FROM_CACHE = os.environ.get("SPARSE_DP_STUDY_FROM_CACHE") == "1"
OPTIMIZER = os.environ.get("SPARSE_DP_STUDY_OPTIMIZER") or None
LEARNING_RATE = os.environ.get("SPARSE_DP_STUDY_LEARNING_RATE")
LEARNING_RATE = float(LEARNING_RATE) if LEARNING_RATE else None

# %%
from sparse_dp.jobs.study.presets import preset
from sparse_dp.jobs.study.studies import show, show_claims, trained_with

trained_with(preset(PRESET), OPTIMIZER, LEARNING_RATE).describe()

# %%
streams = show("streaming", PRESET, DATA, OUT, OPTIMIZER, LEARNING_RATE, FROM_CACHE)

# %% [markdown]
# ## Does the paper's claim hold here?
#
# Computed from the report above.

# %%
verdict = show_claims(streams)
