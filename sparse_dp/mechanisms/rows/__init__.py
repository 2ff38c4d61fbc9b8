"""The rows a batch touches, held at the fixed shapes XLA compiles: padded, sorted
row lists (``padding``, ``sorted_ids``), (example, row) activations, the scans and
searches they are built from (``scans``), and DP-FEST's bucket remapping (``remapping``)."""
