"""How a study trains its points.

The inputs drawn per seed, the flags of ``sparse-dp train``, ``--grid`` files, the run cache.
"""
