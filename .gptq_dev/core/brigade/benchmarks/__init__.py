"""Benchmarks behind ``brigade bench``: datasets, timed runs of Brigade and the HF peer, JSON records."""
