"""The entry point and the Keras wrappers: :func:`~.entry_point.make_private` makes a
compiled Keras model DP and returns its :class:`~.private_training.PrivateTraining`; it
installs the DP ``train_step`` (:mod:`.dp_train_step`) and the private ``fit``,
``train_on_batch`` and ``compile`` (:mod:`.fit_wrappers`), whose host guards
(:mod:`.host_guards`) and callbacks (:mod:`.callbacks`) enforce the budget outside XLA."""
