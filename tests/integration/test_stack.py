"""Both stacks: Keras 2 without TF_USE_LEGACY_KERAS, Keras 3 refused, TF Privacy's trainer."""

import argparse
import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from sparse_dp import _keras, keras
from sparse_dp.jobs.bench import step_time_benchmark

from support.stacks import TF_PRIVACY_STACK

KERAS3_STACK = tuple(int(part) for part in tf.__version__.split(".")[:2]) >= (2, 16)
needs_keras3 = pytest.mark.skipif(not KERAS3_STACK,
                                  reason=f"TensorFlow {tf.__version__} has no Keras 3")


def run_python(source: str, tmp_path) -> str:
  """Runs ``source`` in a fresh interpreter that has no TF_USE_LEGACY_KERAS set."""
  env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
  done = subprocess.run([sys.executable, "-c", textwrap.dedent(source)], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300, check=False)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout


def test_sparse_dp_keras_is_keras_2():
  # Keras 2's Layer lives in engine.base_layer (keras 2.15 or tf_keras); Keras 3's does not.
  assert keras.layers.Layer.__module__.endswith("src.engine.base_layer")


@pytest.mark.slow
def test_tf_keras_and_tfrs_are_keras_2_when_sparse_dp_comes_before_tf_keras(tmp_path):
  out = run_python("""
      import tensorflow as tf
      import sparse_dp
      import tensorflow_recommenders as tfrs
      assert tf.keras.layers.Layer is sparse_dp.keras.layers.Layer, tf.keras
      model = tf.keras.Sequential([sparse_dp.layers.Embedding(10, 2)])
      model(tf.constant([1, 2], tf.int64))
      print("Layer from", tf.keras.layers.Layer.__module__)
      """, tmp_path)
  assert "src.engine.base_layer" in out


@pytest.mark.slow
@pytest.mark.skipif(KERAS3_STACK, reason="a TF 2.15 regression: only there is tf_keras a second "
                    "Keras beside tf.keras, imported by TensorFlow's SavedModel loader")
def test_a_keras_file_loads_after_a_savedmodel_of_a_private_model(tmp_path):
  """TF 2.15: TensorFlow's SavedModel loader imports tf_keras for a legacy optimizer (the
  LazyAdam of every private model); a .keras load after it used to loop forever."""
  out = run_python("""
      import numpy as np
      import tensorflow as tf
      import sparse_dp
      from sparse_dp import keras
      from sparse_dp.layers import Embedding
      from tensorflow.python.util import tf_export

      def model():
        ids = keras.Input(shape=(), dtype=tf.int64)
        model = keras.Model(ids, keras.layers.Dense(1)(Embedding(10, 2)(ids)))
        model.compile(optimizer="adam", loss=keras.losses.BinaryCrossentropy(from_logits=True))
        return model

      trained = model()
      private = sparse_dp.make_private(
          trained, sparse_dp.DPConfig("adafest", sigma1=1.0, sigma2=1.0, threshold=1.0),
          num_examples=64, batch_size=16)
      ids, labels = np.arange(64) % 10, (np.arange(64) % 2).astype("float32")
      trained.fit(private.poisson_dataset(ids, labels, epochs=0.25), verbose=0)
      trained.save("savedmodel")
      print(type(keras.models.load_model("savedmodel").optimizer).__name__)
      assert tf_export.get_symbol_from_name("keras.layers.Dense") is keras.layers.Dense
      model().save("other.keras")
      print(type(keras.models.load_model("other.keras").layers[1]).__name__)
      """, tmp_path)
  assert out.split() == ["LazyAdam", "Embedding"]


@pytest.mark.slow
@pytest.mark.parametrize("first_import", [
    "from sparse_dp import keras", "import sparse_dp._keras", "import sparse_dp.layers.embedding",
    "import sparse_dp.optimizers", "import sparse_dp.training", "import sparse_dp.mechanisms",
    "import sparse_dp; sparse_dp.make_private", "import tensorflow; import sparse_dp"])
def test_any_first_import_loads_and_registers_the_keras_objects(first_import, tmp_path):
  """Whichever sparse_dp module loads TensorFlow, load_model then finds our layers."""
  out = run_python(f"""
      {first_import}
      from sparse_dp import keras
      print(keras.utils.get_registered_object("sparse_dp>Embedding"),
            keras.utils.get_registered_object("sparse_dp>LazyAdam"))
      """, tmp_path)
  assert "sparse_dp.layers.embedding.Embedding" in out and "sparse_dp.optimizers.LazyAdam" in out


@pytest.mark.slow
@needs_keras3
def test_tfrs_after_keras_3_was_used_fails_naming_the_fix(tmp_path):
  """Once tf.keras is Keras 3, nothing switches it back; TFRS says what to set."""
  out = run_python("""
      import tensorflow as tf
      tf.keras.layers.Dense(1)
      import sparse_dp
      try:
        import tensorflow_recommenders
      except ImportError as error:
        print(error)
      """, tmp_path)
  assert "TF_USE_LEGACY_KERAS=1" in out


@needs_keras3
def test_keras_3_model_is_refused_naming_the_fix():
  import keras as keras3
  model = keras3.Sequential([keras3.Input((3,)), keras3.layers.Dense(1)])
  with pytest.raises(_keras.Keras3ModelError, match=r"Keras 3 model.*import tf_keras as keras"):
    _keras.require_keras2_model(model)


@needs_keras3
def test_keras_3_layer_inside_a_keras_2_model_is_refused_by_its_path():
  import keras as keras3

  class Mixed(keras.Model):

    def __init__(self):
      super().__init__()
      self.hidden = keras3.layers.Dense(2)
      self.out = keras.layers.Dense(1)

    def call(self, x):
      return self.out(self.hidden(x))

  model = Mixed()
  model(tf.zeros([1, 3]))
  with pytest.raises(_keras.Keras3ModelError, match=r"model\.hidden is a Keras 3 layer"):
    _keras.require_keras2_model(model)


def test_keras_2_model_passes():
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
  _keras.require_keras2_model(model)


@pytest.mark.skipif(TF_PRIVACY_STACK, reason="TF Privacy is installed on this stack")
def test_tf_privacy_trainer_is_refused_where_tf_privacy_is_not_installed():
  args = argparse.Namespace(trainers="dpsgd-tfp,adafest", vocab="100", optimizer="sgd", dim=4,
                            batch_size=8, steps=1, clip=1.0, sigma1=1.0, sigma2=1.0, tau=1.0,
                            timeout=60, json=True)
  with pytest.raises(ValueError, match=r"dpsgd-tfp needs TF Privacy.*--trainers adafest"):
    step_time_benchmark.run(args)
