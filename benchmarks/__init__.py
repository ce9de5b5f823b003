"""The benchmarks, one script each (``python benchmarks/latency.py``), shipped in the wheel
as ``aenvs.benchmarks`` so that ``aenvs bench`` (:mod:`aenvs.bench`) runs them from an
installed aenvs too."""
