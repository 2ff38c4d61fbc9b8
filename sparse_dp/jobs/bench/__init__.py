"""Benchmarks behind ``sparse-dp bench``; each writes JSON."""
