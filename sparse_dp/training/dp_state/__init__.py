"""The DP state a run keeps with its model: steps taken, noise draws, the record of each
step (:mod:`.state`, :mod:`.dp_record`), and the fingerprint that finds weights moved
outside the DP step (:mod:`.weight_fingerprint`)."""
