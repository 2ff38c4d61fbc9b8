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
# # Quickstart: a private Criteo pCTR model in a few lines
#
# The pCTR model of Ghazi et al. (NeurIPS 2023) (one `sparse_dp.layers.Embedding` per categorical
# feature, log-transformed integer features, a ReLU tower, one logit) trained with
# DP-AdaFEST at epsilon 1: `make_private`, Poisson-sampled batches, epsilon in the
# Keras logs, the privacy statement, and the saved model served by TensorFlow.
#
# Parameters (environment variables, so the same notebook runs in CI and on real data):
# `SPARSE_DP_STUDY_PRESET` (`smoke`: seconds, `full`: the committed run),
# `SPARSE_DP_STUDY_DATA` (`synthetic` or a glob of Criteo files),
# `SPARSE_DP_STUDY_OUT` (output folder).

# %% tags=["parameters"]
import os

PRESET = os.environ.get("SPARSE_DP_STUDY_PRESET", "smoke")
DATA = os.environ.get("SPARSE_DP_STUDY_DATA", "synthetic")
OUT = os.environ.get("SPARSE_DP_STUDY_OUT", "study-results")

# %%
import pathlib

import tensorflow as tf

import sparse_dp
from sparse_dp import keras
from sparse_dp.jobs.study.presets import preset
from sparse_dp.jobs.study.runner.inputs import StudyInputs
from sparse_dp.models.pctr import build_pctr_model

sizes = preset(PRESET)
inputs = StudyInputs.load(DATA, sizes.examples, sizes.synthetic_scale, sizes.features,
                          pathlib.Path(OUT) / "data")
(x, y), (x_eval, y_eval) = inputs.train, inputs.held_out
print(f"preset {PRESET}: {len(y):,} training examples, {len(y_eval):,} held out, "
      f"{len(inputs.vocabulary_sizes)} tables of {inputs.rows:,} rows in all")

# %% [markdown]
# ## The model, made private

# %%
model = build_pctr_model(inputs.vocabulary_sizes, hidden_units=sizes.hidden_units)
model.compile(optimizer=keras.optimizers.Adam(sizes.learning_rate),
              loss=keras.losses.BinaryCrossentropy(from_logits=True))
private = sparse_dp.make_private(
    model, sparse_dp.DPConfig("adafest", target_epsilon=1.0, sigma_ratio=2),
    num_examples=len(y), batch_size=sizes.batch_size, epochs=sizes.epochs)
history = model.fit(private.poisson_dataset(x, y, epochs=sizes.epochs),
                    callbacks=[private.callback()], verbose=2)

# %% [markdown]
# ## What was spent

# %%
print(private.report().statement())
logs = {key: values[-1] for key, values in history.history.items()}  # the run so far
print(f"gradient-size reduction: {logs['gradient_size_reduction']:,.0f}x (table rows / "
      f"mean rows a step updated, over every step: {logs['nonzero_rows']:,.1f}, "
      f"from {logs['nonzero_rows_min']:,.0f} to {logs['nonzero_rows_max']:,.0f})")

# %% [markdown]
# ## The saved model, served
#
# A SavedModel like any Keras model's; serving needs neither sparse-dp's training
# code nor its privacy state.

# %%
model.save(pathlib.Path(OUT) / "quickstart_model")
served = tf.saved_model.load(str(pathlib.Path(OUT) / "quickstart_model"))
logits = served.signatures["serving_default"](
    integers=tf.constant(x_eval["integers"]), categorical=tf.constant(x_eval["categorical"]))
auc = keras.metrics.AUC(from_logits=True)
auc.update_state(y_eval, next(iter(logits.values())))
print(f"held-out AUC of the served model: {float(auc.result()):.4f}")

# %% [markdown]
# ## Does the paper's claim hold here?
#
# Ghazi et al.'s claim is that DP-AdaFEST keeps the update sparse at the same privacy
# guarantee: DP-SGD's noise touches every row of every table each step. The AUC it costs
# against DP-SGD is measured in the trade-off notebook.

# %%
spent = private.epsilon()
print(f"DP-AdaFEST updated {logs['nonzero_rows']:,.1f} of {inputs.rows:,} rows a step on "
      f"average ({logs['gradient_size_reduction']:,.0f}x fewer than DP-SGD's {inputs.rows:,}) "
      f"at epsilon {spent:.4f} of the target 1.0: "
      f"{'holds' if logs['gradient_size_reduction'] > 1 and spent <= 1.0 else 'does not hold'} "
      "here.")
