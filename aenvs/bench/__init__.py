"""The benchmark suite behind ``aenvs bench``: every benchmark, a progress bar, one report.

The benchmarks themselves are the scripts in the repository's ``benchmarks/`` folder
(``python benchmarks/latency.py`` runs one alone). The wheel ships that folder as
``aenvs.benchmarks``, so ``aenvs bench`` runs from an installed aenvs as well as from a
checkout. :data:`~aenvs.bench.suite.SUITE` lists them; ``aenvs bench`` runs each in a
fresh interpreter (peers such as TorchRL or Ray change process-wide state: the start
method, environment variables, a Ray session), shows a progress bar with each one's
latest output line, and writes ``report.md``, ``results.json``, one log per benchmark and
the PNG plots (matplotlib) into one folder.

The protocol a benchmark follows (to add one, add a :class:`~aenvs.bench.suite.Benchmark`
to ``SUITE``):

- it is a module ``benchmarks/NAME.py`` (importable as ``aenvs.benchmarks.NAME``) with a
  module-level function that runs the measurement and returns its rows: a list of
  dataclass instances or mappings, JSON-serialisable field values;
- the suite calls it as ``function(**benchmark.full)``, or ``function(**benchmark.quick)``
  under ``aenvs bench --quick``;
- what it prints goes to the log and the progress bar; a peer it cannot use (not
  installed, fails to start) it leaves out and says so, as it would alone;
- ``requires`` names modules it cannot run without (``("ray",)``): where one is not
  installed, or the module itself is not there, the suite skips the benchmark with a
  line in the report and runs the others;
- each :class:`~aenvs.bench.suite.Plot` names the row fields to draw (``y`` against ``x``,
  one line per ``series``, an optional ``ideal`` line); rows without those fields are
  left out of the plot and shown in the report's tables only.

Example:
    >>> from aenvs.bench import SUITE, run_suite
    >>> runs = run_suite([b for b in SUITE if b.name == "latency"], out_dir="bench", quick=True)
"""

from aenvs.bench.suite import SUITE, Benchmark, BenchmarkRun, Plot, run_suite

__all__ = ["SUITE", "Benchmark", "BenchmarkRun", "Plot", "run_suite"]
