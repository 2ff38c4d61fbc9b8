"""The Criteo pCTR model and its jobs.

This folder is the top-level ``models/`` of the repository, installed as
``sparse_dp.models`` (``setup.py``'s ``package_dir``): import it as
``from sparse_dp.models import ...``, never as ``models``.
"""
