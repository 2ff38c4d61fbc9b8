"""``sparse-dp stream``: periodic retraining under one budget, its state, lock and ledger."""
