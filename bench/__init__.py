"""Benchmarks and reproductions: `python -m bench <scenario>` (bench/harness.py; figures in bench/README.md)."""
