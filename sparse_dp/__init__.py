"""sparse-dp: DP training of large embedding models that keeps gradients sparse.

    model.compile(optimizer="adam", loss="binary_crossentropy")
    private = sparse_dp.make_private(model, sparse_dp.DPConfig("adafest", sigma1=5, sigma2=1),
                                     num_examples=N, batch_size=1024)
    model.fit(private.poisson_dataset(x, y, epochs=3), callbacks=[private.callback()])
"""

import importlib

__version__ = "0.1.0"
__all__ = ["DPConfig", "PrivateTraining", "make_private"]


def __getattr__(name):
  # TensorFlow loads only when training is used, not for `sparse-dp privacy`.
  if name in __all__:
    return getattr(importlib.import_module("sparse_dp.training"), name)
  raise AttributeError(f"module 'sparse_dp' has no attribute {name!r}")
