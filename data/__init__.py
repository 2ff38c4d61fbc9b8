"""Criteo readers and the synthetic Criteo generator (installed as ``sparse_dp.data``)."""
