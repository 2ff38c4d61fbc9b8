"""Checks that refuse a model whose examples are not separable (:mod:`.validation`): the
static checks at ``make_private`` (:mod:`.model_checks`, :mod:`.preprocessing_checks`) and
the separability probe run on the first batch (:mod:`.separability` and its parts
``probe_*``)."""
