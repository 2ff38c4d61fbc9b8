"""Criteo readers and the synthetic Criteo generator.

This folder is the top-level ``data/`` of the repository, installed as
``sparse_dp.data`` (``setup.py``'s ``package_dir``): import it as
``from sparse_dp.data import ...``, never as ``data``.
"""
