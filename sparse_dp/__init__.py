"""sparse-dp: DP training of large embedding models that keeps gradients sparse."""

__version__ = "0.1.0"
