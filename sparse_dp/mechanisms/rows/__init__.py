"""The rows a batch touches, as padded, sorted id vectors that XLA compiles at a fixed shape: scans, sorted lookups, padding, (example, row) activations, bucket remappings."""
