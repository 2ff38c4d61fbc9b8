"""Ghazi et al.'s (NeurIPS 2023) trade-off studies on the Criteo pCTR model (``sparse-dp study``).

Each study sweeps the training job of :mod:`sparse_dp.jobs.train.fitting` (or the
streaming job, or the step benchmark) over the hyper-parameters of one figure
or table of the paper, repeats every point over seeds, and writes a JSON report
(the numbers), a markdown table and a PNG figure drawn from the JSON alone.
The notebooks under ``notebooks/`` call these functions; the sizes come from a
named preset (:mod:`sparse_dp.jobs.study.presets`).
"""
