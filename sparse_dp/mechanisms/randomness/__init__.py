"""Seeds and the Gaussian and exponential draws of the mechanisms (stateless, so a step's noise is reproducible from its seed)."""
