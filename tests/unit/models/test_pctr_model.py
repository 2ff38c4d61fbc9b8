"""The pCTR model's SavedModel: what Keras and TensorFlow Serving load back."""

import numpy as np
import pytest
import tensorflow as tf

from sparse_dp import keras
from sparse_dp.models import pctr


def test_a_saved_model_serves_and_loads_as_the_model_predicts(tmp_path):
  model = pctr.build_pctr_model([7, 5, 3], (4,))
  model.compile(optimizer=keras.optimizers.legacy.Adam(0.1),
                loss=keras.losses.BinaryCrossentropy(from_logits=True))
  rng = np.random.default_rng(0)
  x = {"integers": rng.normal(size=(6, 13)).astype(np.float32),
       "categorical": rng.integers(0, 3, (6, 3))}
  model.fit(x, rng.integers(0, 2, (6, 1)).astype(np.float32), verbose=0)
  pctr.save_model(model, tmp_path / "model")
  expected = model(x, training=False).numpy()
  # TensorFlow Serving's view: the signature Keras writes by default, named by the output layer.
  serving = tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"]
  served = serving(integers=tf.constant(x["integers"]), categorical=tf.constant(x["categorical"]))
  assert list(served) == ["logit"]
  np.testing.assert_allclose(served["logit"].numpy(), expected, rtol=1e-6)
  # Keras rebuilds it from the layers' configs, with its optimizer.
  loaded = keras.models.load_model(tmp_path / "model")
  np.testing.assert_allclose(loaded(x, training=False).numpy(), expected, rtol=1e-6)
  assert [type(layer).__name__ for layer in loaded.layers if "embedding" in layer.name] == \
      ["Embedding"] * 3
  assert type(loaded.optimizer) is type(model.optimizer)


def test_a_model_without_inputs_is_refused_before_anything_is_written(tmp_path):
  class Never(keras.Model):
    def call(self, x):
      return x

  with pytest.raises(ValueError, match="has no inputs yet: call it on a batch"):
    pctr.save_model(Never(), tmp_path / "model")
  assert not (tmp_path / "model").exists()
