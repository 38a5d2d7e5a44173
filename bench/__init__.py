"""Benchmarks; run each module with ``python -m bench.<name>`` (not part of pytest)."""
