"""How a study trains its points: the inputs drawn per seed, the flags of ``sparse-dp train``, ``--grid`` files, the run cache."""
