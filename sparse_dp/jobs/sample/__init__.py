"""Poisson sampling of datasets larger than memory, on Apache Beam (``sparse-dp sample``).

* :mod:`.draws`: the keyed, secret-seeded draws (geometric skips, truncation);
* :mod:`.pipeline`: the Beam pipeline that writes the batches and the manifest;
* :mod:`.manifest`: what a sample is and the files that hold it;
* :mod:`.batches`: reading the batches for training (``sparse-dp train --reader batches``);
* :mod:`.step_claims`: the batches training runs have taken, so that none trains twice;
* :mod:`.sample_ledger`: the samples drawn with a seed file, so that none is drawn twice;
* :mod:`.sample_command`: the ``sparse-dp sample`` command.

Importing this package imports neither Beam nor TensorFlow.
"""
