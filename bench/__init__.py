"""Benchmarks: `python -m bench.<name>`; figures go to docs/benchmarks.md."""
