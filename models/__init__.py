"""The Criteo pCTR model and its jobs (installed as ``sparse_dp.models``)."""
