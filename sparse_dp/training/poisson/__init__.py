"""Poisson sampling of training batches (:mod:`.poisson_sampling`) and the padded batches of one
static size that compiled steps are fed (:mod:`.padded_batches`)."""
