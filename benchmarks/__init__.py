"""aenvs's benchmarks, one script each (``python benchmarks/latency.py``), and the suite that
runs them together (``benchmarks.harness``: ``aenvs bench`` or ``make bench`` from a checkout).

They live beside the package, not in it: the wheel holds the library only."""
