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
# # Step time (Ghazi et al., NeurIPS 2023, Table 4) and pCTR throughput by vocabulary scale
#
# `sparse-dp bench step` times the Table-4 model (one table of dim 64, batch 1024, each
# trainer in its own process): DP-SGD's dense noise grows with the vocabulary, the
# sparse step does not (the paper: 3x at 1e5 rows to 177x at 1e7). Then the pCTR job
# at the Table-3 vocabulary sizes times each scale, per algorithm: examples per second
# as the job reports them, with each point's AUC, epsilon and gradient-size reduction.
#
# Parameters (environment variables): `SPARSE_DP_STUDY_PRESET` (`smoke`: minutes, for CI;
# `full`: the results committed under `benchmarks/results/study`), `SPARSE_DP_STUDY_DATA`
# (`synthetic`, or a glob of Criteo files), `SPARSE_DP_STUDY_OUT` (output folder; trained
# runs are cached in `OUT/runs`, so a rerun or another study sharing a point reuses it),
# `SPARSE_DP_STUDY_FROM_CACHE` (`1`: train no pCTR point, show the cached ones; Table 4
# is measured anew), `SPARSE_DP_STUDY_OPTIMIZER` and `SPARSE_DP_STUDY_LEARNING_RATE`
# (every run's; unset: the preset's). The same study runs from the shell: `sparse-dp
# study step-time --preset full --out DIR [--from-cache] [--optimizer NAME
# --learning-rate LR]`.

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
timing = show("step-time", PRESET, DATA, OUT, OPTIMIZER, LEARNING_RATE, FROM_CACHE)

# %% [markdown]
# ## Does the paper's claim hold here?
#
# Computed from the report above.

# %%
verdict = show_claims(timing)
