"""Benchmarks: scripts that print ratios measured side by side in one run.

Owns the kernel microbenchmarks, the one-batch and serving benchmarks, their
jsonl output and plots. Speed is measured here, never asserted by tests.
"""
