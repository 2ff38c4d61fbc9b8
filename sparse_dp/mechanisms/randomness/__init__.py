"""Seeds and the Gaussian and exponential draws of the mechanisms.

Stateless, so a step's noise is reproducible from its seed.
"""
