"""The suite's report: ``report.md`` (tables, plots, skips and failures) and ``results.json``."""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from .suite import BenchmarkRun

__all__ = ["PEERS", "load_results", "machine", "make_header", "status", "versions", "write_report"]

PEERS = ("gymnasium", "torchrl", "envpool", "ray")
PACKAGES = ("aenvs", "torch", "tensordict", "numpy", "uvloop", "matplotlib", *PEERS)


def versions() -> dict[str, str | None]:
    """Installed version of aenvs, its dependencies and its peers (None where not installed)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def machine() -> str:
    """Cores and CPU model, e.g. ``2 cores (AMD EPYC 7B13)``."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            models = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        model = models[0] if models else model
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({model})"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        return f"{value:.2f}" if abs(value) >= 1 else f"{value:.3f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def tables(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Markdown tables of ``rows``, one per set of fields (a benchmark may return several kinds)."""
    kinds: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        kinds.setdefault(tuple(row), []).append(row)
    lines: list[str] = []
    for fields, kind in kinds.items():
        lines += ["| " + " | ".join(fields) + " |", "|" + "---|" * len(fields)]
        lines += ["| " + " | ".join(_cell(row[f]) for f in fields) + " |" for row in kind]
        lines.append("")
    return lines


def status(run: BenchmarkRun) -> str:
    """One line: how many rows, or why it was skipped or failed."""
    if run.skipped is not None:
        return f"skipped: {run.skipped}"
    if run.failed is not None:
        return f"**failed**: {run.failed}"
    return f"{len(run.rows)} rows"


def make_header(command: str, *, quick: bool, started: float) -> dict[str, Any]:
    """What the report says about a run: its command, machine, versions and times.

    Example:
        >>> header = make_header("aenvs bench", quick=False, started=time.time())
    """
    return {
        "command": command,
        "quick": quick,
        "started": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
        "started_epoch": started,
        "wall_s": time.time() - started,
        "machine": machine(),
        "cpu_count": os.cpu_count(),
        "versions": versions(),
    }


def write_report(
    runs: Sequence[BenchmarkRun], out_dir: str | os.PathLike[str], header: Mapping[str, Any]
) -> Path:
    """Write ``report.md``, ``results.json`` and the plots of ``runs`` into ``out_dir``.

    Plots need matplotlib (the ``bench`` extra); without it the report says so.

    Example:
        >>> runs = run_suite(SUITE, out_dir="bench")
        >>> write_report(runs, "bench", make_header("aenvs bench", quick=False, started=t0))
    """
    from .plots import draw

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    found: dict[str, str | None] = header["versions"]
    peers = [p for p in PEERS if found.get(p)]
    lines = [
        "# aenvs bench" + (" (quick run: too short to quote)" if header["quick"] else ""),
        "",
        f"`{header['command']}` on {header['machine']}, {header['started']}, "
        f"{header['wall_s'] / 60:.1f} min in all.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in found.items() if v) + ".",
        f"Peers installed: {', '.join(peers) or 'none'}"
        + (
            f"; not installed: {', '.join(p for p in PEERS if p not in peers)}."
            if len(peers) < len(PEERS)
            else "."
        ),
        "",
        "Each benchmark ran in a fresh interpreter. The 1-minute load average before and after each "
        f"shows whether other jobs shared the {header['cpu_count']} cores: read the figures as ratios "
        "between systems measured in the same run.",
        "",
        "| benchmark | result | seconds | load before, after |",
        "|---|---|---:|---|",
    ]
    for run in runs:
        load = f"{run.load[0]:.1f}, {run.load[1]:.1f}" if run.skipped is None else ""
        seconds = f"{run.seconds:.0f}" if run.skipped is None else ""
        lines.append(f"| {run.benchmark.name} | {status(run)} | {seconds} | {load} |")
    lines.append("")

    plots = True
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        plots = False
        lines += [
            "No plots: matplotlib is not installed (`pip install -e . --group bench` in the checkout).",
            "",
        ]
    for run in runs:
        lines += [f"## {run.benchmark.title}", ""]
        if not run.ok:
            lines += [status(run).capitalize() + ".", ""]
        for plot in run.benchmark.plots if plots else ():
            if draw(plot, run.rows, out / plot.file):
                lines += [f"![{plot.title}]({plot.file})", ""]
        lines += tables(run.rows)
        if run.log is not None:
            lines += [f"Output: [{run.log}]({run.log}).", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    results = {
        **header,
        "benchmarks": [
            {
                "name": run.benchmark.name,
                "title": run.benchmark.title,
                "seconds": run.seconds,
                "skipped": run.skipped,
                "failed": run.failed,
                "load": run.load,
                "rows": run.rows,
            }
            for run in runs
        ],
    }
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return report


def load_results(path: str | os.PathLike[str]) -> tuple[list[BenchmarkRun], dict[str, Any]]:
    """The runs a ``results.json`` holds (drawn with the suite's current plots), and its header.

    Example:
        >>> runs, header = load_results("docs/bench/results.json")
        >>> write_report(runs, "docs/bench", header)  # the same report, plots drawn anew
    """
    from .suite import SUITE, Benchmark

    data = json.loads(Path(path).read_text())
    known = {b.name: b for b in SUITE}
    runs = []
    for entry in data["benchmarks"]:
        benchmark = known.get(entry["name"]) or Benchmark(entry["name"], entry["title"])
        runs.append(
            BenchmarkRun(
                benchmark,
                rows=entry["rows"],
                seconds=entry["seconds"],
                skipped=entry["skipped"],
                failed=entry["failed"],
                log=f"{benchmark.name}.log" if entry["skipped"] is None else None,
                load=tuple(entry["load"]),  # pyright: ignore[reportArgumentType]
            )
        )
    header = {k: v for k, v in data.items() if k != "benchmarks"}
    return runs, header
