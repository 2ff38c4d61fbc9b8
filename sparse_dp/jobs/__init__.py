"""The jobs behind the ``sparse-dp`` commands, apart from the library they use.

Each subpackage is one command: ``train`` and ``stream`` (the pCTR jobs),
``sample`` (Poisson sampling on Apache Beam), ``audit``, ``distill``, ``study``
(the paper's trade-off studies) and ``bench``. The dispatcher is
:mod:`sparse_dp.cli`; the map of the package is ``docs/package_layout.md``.
"""
