"""The ``memory`` provider: simulated instances kept in memory (tests and benchmarks)."""
