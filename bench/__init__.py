"""Benchmark suite (issue 7): ``python -m bench.run``. Not a test; nothing here runs in CI."""
