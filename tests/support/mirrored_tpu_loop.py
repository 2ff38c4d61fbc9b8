"""DP-AdaFEST steps of ``TPUTrainer`` and of ``fit`` on two mirrored replicas; prints the results.

``test_tpu_two_program_loop.py`` compares them with its own one-replica run of the loop on
the same 3 batches (one replica needs no logical devices).

On two replicas the table is built with ``table_placement='host'``, as the
engine's loop keeps it on a TPU: one variable on the host, none per replica.

Run as a script: logical CPU devices must be configured before TensorFlow
starts, so ``test_tpu_two_program_loop.py`` runs this in a fresh process. It
makes one ``MirroredStrategy``: a second one in the same process starts its
collectives under the first one's instance keys, and they collide.
"""

import json

import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

from keras_models import N, functional_model, synthetic_data  # noqa: E402

import sparse_dp  # noqa: E402
from sparse_dp import keras  # noqa: E402
from sparse_dp.layers.embedding_backends.doubles.tpu_api_double import TPUEmbeddingAPIDouble  # noqa: E402
from sparse_dp.training.tpu_loop import TPUTrainer  # noqa: E402

ADAFEST = dict(sigma1=3.0, sigma2=0.8, threshold=6.0, noise_seed=4)


def train(strategy, loop: bool, table_placement: str = "default_device") -> dict:
  """Three steps on the same three batches of 128: ``TPUTrainer`` (``loop``) or ``fit``."""
  ids, labels = synthetic_data()
  batches = tf.data.Dataset.from_tensor_slices((ids, labels)).batch(128).take(3)
  with strategy.scope():
    model = functional_model(optimizer=keras.optimizers.Adam(0.01),
                             table_placement=table_placement)
    private = sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", **ADAFEST),
                                     num_examples=N, batch_size=128, embedding="cpu")
  result = {}
  if loop:
    trainer = TPUTrainer(private, api_factory=TPUEmbeddingAPIDouble)
    result["nonzero_rows"] = [step["nonzero_rows"] for step in trainer.fit(batches)]
    result["calls"] = [list(call) for call in trainer.engine.api.calls]
  else:
    model.fit(batches, verbose=0)
  table = model.get_layer("ids").embeddings
  return {**result, "steps": private.accountant.steps,
          "table": {"copies": len(getattr(table, "values", [table])), "device": table.device},
          "weights": [w.numpy().tolist() for w in model.trainable_weights]}


def xla_refusal(strategy) -> str:
  """What ``TPUTrainer(jit_compile=True)`` says on ``strategy``."""
  with strategy.scope():
    model = functional_model()
    private = sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", **ADAFEST),
                                     num_examples=N, batch_size=128, embedding="cpu")
  try:
    TPUTrainer(private, api_factory=TPUEmbeddingAPIDouble, jit_compile=True)
  except ValueError as refusal:
    return str(refusal)
  return ""


if __name__ == "__main__":
  mirrored = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  print(json.dumps({"two": train(mirrored, loop=True, table_placement="host"),
                    "fit_two": train(mirrored, loop=False),
                    "xla_refusal": xla_refusal(mirrored)}))
