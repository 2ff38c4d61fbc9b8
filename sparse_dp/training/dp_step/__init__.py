"""The DP step: per-example gradients, clipping, the sparse noisy update and its guards.

:mod:`.step` computes one step's private gradients (:func:`~.step.private_gradients`) from
each example's loss alone (:mod:`.per_example`, :mod:`.dense_layers`, :mod:`.losses`,
:mod:`.penalties`), refusing a forward pass that writes state (:mod:`.state_writes`) and
any optimizer update outside the step (:mod:`.update_guard`). :mod:`.mixed_precision`,
:mod:`.input_ids` and :mod:`.run_statistics` are what the step reads of the model and
reports of the run; :mod:`.tracing` has AutoGraph call the step as written.
"""
