"""Counts XLA compilations of a compiled private fit (run by test_xla.py in a subprocess).

TensorFlow logs each compilation of an XLA executable (``device_compiler``,
verbose level 1); the count shows whether XLA compiled the step once or again
for every new batch.
"""

import sys

from keras_models import N, functional_model, synthetic_data

import sparse_dp
from sparse_dp import keras

steps = int(sys.argv[1])
ids, labels = synthetic_data()
model = functional_model(seed=3)
model.compile(optimizer=keras.optimizers.legacy.SGD(0.5),
              loss=keras.losses.BinaryCrossentropy(from_logits=True), jit_compile=True)
private = sparse_dp.make_private(
    model, sparse_dp.DPConfig("adafest", noise_seed=1, sigma1=3.0, sigma2=0.8, threshold=3.0),
    num_examples=N, batch_size=256)
model.fit(private.poisson_dataset(ids, labels).take(steps), verbose=0)
print("steps", private.accountant.steps)
