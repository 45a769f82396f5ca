"""Benchmarks of Tether against peer queues: ``python -m bench.run`` (see bench/run.py)."""
