"""The benchmark suite behind ``aenvs bench``: every benchmark, a progress bar, one report.

The suite lives beside the package, in a checkout of the repository: the benchmarks are
the scripts in ``benchmarks/`` (``python benchmarks/latency.py`` runs one alone) and this
folder is what runs them together. Neither ships in the wheel. ``aenvs bench`` (or
``make bench``, or ``python -m benchmarks``) run from a checkout finds this folder and
calls :func:`main`, which owns the command's options. ``SUITE`` lists the benchmarks; the suite runs each in a fresh
interpreter (peers such as TorchRL or Ray change process-wide state: the start method,
environment variables, a Ray session), shows a progress bar with each one's latest output
line, and writes ``report.md``, ``results.json``, one log per benchmark and the PNG plots
(matplotlib) into one folder.

The protocol a benchmark follows (to add one, add a ``Benchmark`` to ``SUITE`` in
``suite.py``):

- it is a module ``benchmarks/NAME.py`` (importable as ``benchmarks.NAME`` from the
  checkout's root) with a module-level function that runs the measurement and returns its
  rows: a list of dataclass instances or mappings, JSON-serialisable field values;
- the suite calls it as ``function(**benchmark.full)``, or ``function(**benchmark.quick)``
  under ``aenvs bench --quick``;
- what it prints goes to the log and the progress bar; a peer it cannot use (not
  installed, fails to start) it leaves out and says so, as it would alone;
- ``requires`` names modules it cannot run without (``("ray",)``): where one is not
  installed, or the module itself is not there, the suite skips the benchmark with a
  line in the report and runs the others;
- each ``Plot`` names the row fields to draw (``y`` against ``x``, one line per
  ``series``, an optional ``ideal`` line); rows without those fields are left out of the
  plot and shown in the report's tables only.

Example:
    >>> from benchmarks.harness import SUITE, run_suite
    >>> runs = run_suite([b for b in SUITE if b.name == "latency"], out_dir="bench", quick=True)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .suite import SUITE, Benchmark, BenchmarkRun, Plot, run_suite

__all__ = ["SUITE", "Benchmark", "BenchmarkRun", "Plot", "build_parser", "command", "main", "run_suite"]

ROOT = Path(__file__).resolve().parents[2]  # the checkout this suite belongs to


def _default_out(quick: bool) -> Path:
    """Where a run writes: the checkout's ``docs/bench`` (the committed report) for a full
    run, ``./aenvs-bench`` for a quick one (its figures are not for quoting)."""
    return Path("aenvs-bench") if quick else ROOT / "docs" / "bench"


DESCRIPTION = (
    "Run the benchmarks (latency, throughput, sync overhead, text envs, remote where Ray is installed), "
    "each in a fresh interpreter, against whichever peers are installed (gymnasium, TorchRL, "
    "EnvPool: `make bench`, or `pip install -e . --group bench`), and write report.md, results.json, each benchmark's "
    "output and PNG plots into one folder. About 8 minutes on 2 cores; --quick, about 2. "
    "The suite lives in a checkout of the aenvs repository (benchmarks/), not in the package: "
    "run this from a checkout."
)


def build_parser(prog: str = "python -m benchmarks") -> argparse.ArgumentParser:
    """The suite's command line (``aenvs bench`` hands its arguments to :func:`main`)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=DESCRIPTION,
        epilog=f"example: {prog} --quick --only latency,sync_overhead --out /tmp/bench",
    )
    parser.add_argument(
        "--out",
        default=None,
        help="folder for the report (default: the checkout's docs/bench; ./aenvs-bench for --quick)",
    )
    parser.add_argument("--only", default=None, help="comma-separated benchmarks to run (default: all)")
    parser.add_argument(
        "--quick", action="store_true", help="short measurements: checks the suite, not for quoting"
    )
    parser.add_argument("--list", action="store_true", help="list the suite's benchmarks and exit")
    parser.add_argument(
        "--replot",
        action="store_true",
        help="measure nothing: rewrite report and plots from OUT/results.json",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def main(argv: list[str] | None = None, prog: str = "python -m benchmarks") -> int:
    """Parse ``argv`` (default: the command line) and run :func:`command`; the exit code."""
    return command(build_parser(prog).parse_args(argv))


def command(args: argparse.Namespace) -> int:
    """The suite run as :func:`build_parser`'s parsed arguments say; the exit code."""
    from .report import load_results, make_header, status, write_report

    names = [b.name for b in SUITE]
    if args.list:
        for b in SUITE:
            print(f"{b.name:14s} {b.title}")
        return 0
    out = Path(args.out) if args.out else _default_out(args.quick)
    if args.replot:
        runs, header = load_results(out / "results.json")
        print(f"report: {write_report(runs, out, header)} (from {out / 'results.json'}, nothing measured)")
        return 0
    only = args.only.split(",") if args.only else names
    unknown = sorted(set(only) - set(names))
    if unknown:
        print(f"aenvs bench: unknown benchmarks {unknown}; the suite has {names}", file=sys.stderr)
        return 2
    line = "aenvs bench" + (" --quick" if args.quick else "") + (f" --only {args.only}" if args.only else "")
    print(f"{line}: {len(only)} benchmarks, writing to {out}", flush=True)
    started = time.time()
    runs = run_suite(
        [b for b in SUITE if b.name in only], out_dir=out, quick=args.quick, progress=not args.no_progress
    )
    report = write_report(runs, out, make_header(line, quick=args.quick, started=started))
    for run in runs:
        print(f"  {run.benchmark.name:14s} {run.seconds:6.0f} s  {status(run)}")
    print(f"report: {report}  ({(time.time() - started) / 60:.1f} min)")
    return 1 if any(run.failed for run in runs) else 0
