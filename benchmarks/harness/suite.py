"""The suite's benchmarks and the runner that runs each in a fresh interpreter."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

__all__ = ["SUITE", "Benchmark", "BenchmarkRun", "Plot", "run_suite"]


@dataclass(frozen=True)
class Plot:
    """One PNG of a benchmark's rows: ``y`` against ``x`` (log 2), one line per ``series``.

    ``where`` keeps the rows whose fields have those values (one figure per workload);
    ``labels`` renames series for the legend. Rows that all share one x value are drawn
    as bars. Each system is drawn alike in every plot (``benchmarks/harness/plots.py``).

    Example:
        >>> Plot("latency.png", "N envs of 10 ms", y="percent_of_ideal", ylog=False)
    """

    file: str
    title: str
    x: str = "n"
    y: str = "steps_per_s"
    series: str = "system"
    where: Mapping[str, Any] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    ideal: str | None = None  # a field holding the ideal y at each x, drawn as a dotted black line
    xlabel: str = "N envs"
    ylabel: str = "env steps/s"
    ylog: bool = True


@dataclass(frozen=True)
class Benchmark:
    """One benchmark of the suite: which function measures, with what, and how to draw it.

    Example:
        >>> Benchmark("remote", "Ray executor", requires=("ray",), quick={"quick": True})
    """

    name: str
    title: str
    function: str = "measure"
    full: Mapping[str, Any] = field(default_factory=dict)
    quick: Mapping[str, Any] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    plots: tuple[Plot, ...] = ()
    timeout: float = 600.0
    module: str = ""  # default: benchmarks.NAME (benchmarks/NAME.py)

    @property
    def module_name(self) -> str:
        return self.module or f"benchmarks.{self.name}"


@dataclass
class BenchmarkRun:
    """What running one benchmark gave: its rows, or why it was skipped or failed."""

    benchmark: Benchmark
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    skipped: str | None = None
    failed: str | None = None
    log: str | None = None  # file name of its output, beside the report
    load: tuple[float, float] = (0.0, 0.0)  # 1-minute load average before and after

    @property
    def ok(self) -> bool:
        return self.skipped is None and self.failed is None


# `full` keeps the whole suite under 10 minutes on 2 cores (about 8); each script run alone
# (python benchmarks/NAME.py) measures longer.
SUITE: tuple[Benchmark, ...] = (
    Benchmark(
        "latency",
        "Latency: N envs whose step takes 10 ms, overlapped loop, against the ideal N/L",
        full={"duration": 2.0},
        quick={"duration": 0.3},
        plots=(
            Plot(
                "latency.png",
                "N envs whose step takes 10 ms (uvloop)",
                y="percent_of_ideal",
                ylabel="% of the ideal N / 10 ms",
                ylog=False,
            ),
        ),
        timeout=300,
    ),
    Benchmark(
        "throughput",
        "Throughput: random actions with auto-reset, aenvs against gymnasium, EnvPool and TorchRL",
        full={"duration": 1.0, "warmup": 0.3, "attempts": 1},
        quick={"duration": 0.3, "warmup": 0.1, "sizes": (8,), "attempts": 1},
        plots=(
            Plot("throughput-cartpole.png", "CartPole-v1, random actions", where={"workload": "cartpole"}),
            Plot("throughput-cpu.png", "About 1 ms of numpy a step", where={"workload": "cpu"}),
            Plot("throughput-pixels.png", "4x84x84 uint8 observations", where={"workload": "pixels"}),
            Plot("throughput-vector.png", "gymnasium vector API, CartPole-v1", where={"workload": "vector"}),
        ),
        timeout=480,
    ),
    Benchmark(
        "sync_overhead",
        "Sync shim: CartPole-v1 step_and_maybe_reset loop, aenvs against TorchRL and gymnasium",
        full={"num_envs": (4, 8), "steps": 1000, "repeats": 3},
        quick={"num_envs": (4,), "steps": 200, "repeats": 1},
        plots=(
            Plot(
                "sync_overhead.png",
                "Batched envs, CartPole-v1",
                x="num_envs",
                y="steps_per_second",
                series="name",
            ),
        ),
        timeout=300,
    ),
    Benchmark(
        "text_envs",
        "Text envs: 200-2,000-character observations and text actions, aenvs against gymnasium",
        full={"num_envs": (8, 64), "steps": 2000, "repeats": 3, "gymnasium_max_n": 64, "async_n": 4096},
        quick={
            "num_envs": (8,),
            "steps": 200,
            "repeats": 1,
            "gymnasium_max_n": 8,
            "carry_n": 8,
            "async_n": 64,
        },
        plots=(
            Plot("text_envs.png", "Text observations and actions", where={"workload": "text"}),
            Plot("text_envs-carry.png", "Observation kinds, text actions", where={"workload": "carry"}),
            Plot(
                "text_envs-async.png", "Coroutine envs: text or int observations", where={"workload": "async"}
            ),
        ),
        timeout=300,
    ),
    Benchmark(
        "agents",
        "LLM-agent envs: slow long-tailed text envs, a batched policy server; loop shapes and aenvs.collect",
        full={"num_envs": (256, 1024, 4096), "seconds": 3.0, "repeats": 2, "warmup": 5.0},
        quick={"num_envs": (64,), "seconds": 1.0, "repeats": 1, "warmup": 0.5},
        plots=(
            Plot(
                "agents.png",
                "Slow text envs, a batched policy server",
                y="share",
                series="shape",
                labels={
                    "collect": "aenvs.collect",
                    "server": "aenvs.collect over aenvs.serve",
                    "aenvs": "aenvs, hand-written overlapped loop",
                    "lockstep": "lockstep batches",
                    "per-request": "a policy call per request",
                    "flush": "batcher: 64 requests or 2 ms",
                    "threads": "blocking envs on 256 threads",
                    "slot": "batch when a server slot frees",
                },
                ylabel="share of the bound",
                ylog=False,
            ),
        ),
        timeout=600,
    ),
    Benchmark(
        "remote",
        "Remote: the Ray executor against a one-actor-per-env ray.get loop",
        function="run",
        full={"duration": 1.0},  # N = 8 and 64, 1 s a row: about a minute of the suite's ten
        quick={"quick": True},
        requires=("ray",),
        plots=(
            Plot(
                "remote-latency.png",
                "10 ms envs, one machine's Ray",
                y="percent_of_ideal",
                where={"workload": "latency"},
                ylabel="% of the ideal N / 10 ms",
                ylog=False,
            ),
            Plot(
                "remote-cpu.png",
                "About 1 ms of numpy a step, one machine's Ray",
                y="percent_of_ideal",
                where={"workload": "cpu"},
                ylabel="% of the 2 cores' bound",
                ylog=False,
            ),
        ),
        timeout=300,
    ),
)


def _missing(benchmark: Benchmark) -> str | None:
    """Why ``benchmark`` cannot run here (None if it can), without importing anything heavy."""
    for module in benchmark.requires:
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:  # (a bare folder of that name is no package)
            return f"needs {module}, which is not installed"
    try:
        found = importlib.util.find_spec(benchmark.module_name) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        return f"its module {benchmark.module_name} is not there"
    return None


def _child_command(benchmark: Benchmark, quick: bool, rows: Path) -> list[str]:
    kwargs = dict(benchmark.quick if quick else benchmark.full)
    return [
        sys.executable,
        "-m",
        "benchmarks.harness.child",
        "--module",
        benchmark.module_name,
        "--function",
        benchmark.function,
        "--kwargs",
        json.dumps(kwargs),
        "--rows",
        str(rows),
    ]


def _child_env() -> dict[str, str]:
    """The benchmark's environment: unbuffered output, and the checkout's root on its path
    (the suite and the benchmarks are imported from there, whatever the current folder)."""
    root = str(Path(__file__).resolve().parents[2])
    path = [root, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]]
    return {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(path)}


def _run_one(
    benchmark: Benchmark, quick: bool, out_dir: Path, on_line: Callable[[str], None]
) -> BenchmarkRun:
    run = BenchmarkRun(benchmark, log=f"{benchmark.name}.log")
    rows_path = out_dir / f".{benchmark.name}.rows.json"
    rows_path.unlink(missing_ok=True)
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    # a session of its own: a timeout or Ctrl-C stops the benchmark's workers with it
    with (
        open(out_dir / f"{benchmark.name}.log", "w") as log,
        subprocess.Popen(
            _child_command(benchmark, quick, rows_path),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_child_env(),
            start_new_session=True,
        ) as proc,
    ):
        try:
            lines = _follow(proc, started + benchmark.timeout, log, on_line)
        finally:
            _kill_group(proc)  # also whatever it left running
        if lines is None:
            run.failed = f"timed out after {benchmark.timeout:g} s"
        elif proc.returncode != 0:
            run.failed = f"exit code {proc.returncode}: " + " | ".join(lines[-3:])
    run.seconds = time.perf_counter() - started
    run.load = (load_before, os.getloadavg()[0])
    if run.failed is None:
        run.rows = json.loads(rows_path.read_text())
    rows_path.unlink(missing_ok=True)
    return run


def _follow(
    proc: subprocess.Popen[bytes], deadline: float, log: TextIO, on_line: Callable[[str], None]
) -> list[str] | None:
    """Copy ``proc``'s output to ``log`` and its lines to ``on_line`` until it exits (its last
    lines), or None at ``deadline``. Reads the pipe without blocking past the deadline, and
    stops once ``proc`` has exited even if something it started still holds the pipe."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    pending, tail = b"", []
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.perf_counter()
            if now >= deadline:
                return None
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > 2.0:
                break  # the pipe is held open by a process it left: it is killed next
            chunk = os.read(fd, 65536) if selector.select(min(deadline - now, 0.5)) else None
            if chunk == b"":
                break  # every writer is gone
            if chunk:
                pending += chunk
                *complete, pending = pending.split(b"\n")
                for raw in complete:
                    line = raw.decode(errors="replace").rstrip()
                    log.write(line + "\n")
                    if line.strip():
                        tail = [*tail[-19:], line]
                        on_line(line.strip())
                log.flush()
    proc.wait()
    if pending:
        log.write(pending.decode(errors="replace"))
    return tail


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_suite(
    benchmarks: Sequence[Benchmark] = SUITE,
    *,
    out_dir: str | os.PathLike[str],
    quick: bool = False,
    progress: bool = True,
) -> list[BenchmarkRun]:
    """Run ``benchmarks`` one after the other, each in a fresh interpreter; return their runs.

    Each one's output goes to ``out_dir/NAME.log``; a benchmark that cannot run here is
    skipped and one that fails or times out is reported, and the others still run.

    Example:
        >>> runs = run_suite(SUITE, out_dir="bench", quick=True)
        >>> [r.benchmark.name for r in runs if r.skipped]
        ['remote']
    """
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs: list[BenchmarkRun] = []
    bar = Progress(
        TextColumn("{task.description:14s}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[line]}"),
        console=Console(stderr=True),
        disable=not progress,
    )
    with bar:
        task = bar.add_task("", total=len(benchmarks), line="")
        for benchmark in benchmarks:
            bar.update(task, description=benchmark.name)
            reason = _missing(benchmark)
            if reason is not None:
                runs.append(BenchmarkRun(benchmark, skipped=reason))
            else:
                runs.append(_run_one(benchmark, quick, out, lambda line: bar.update(task, line=line[:70])))
            bar.advance(task)
        bar.update(task, description="done", line="")
    return runs
