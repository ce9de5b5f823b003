"""Benchmarks for the suite's tests: they follow the protocol (or break it) in a few ms."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass
class Row:
    system: str
    n: int
    steps_per_s: float
    ideal: float
    percent_of_ideal: float


def measure(sizes: list[int], rate: float = 100.0) -> list[object]:
    """Rows for two systems at each N, plus a row of another kind (shown in a table only)."""
    rows: list[object] = []
    for n in sizes:
        rows.append(Row("aenvs thread", n, rate * n, 2 * rate * n, 50.0))
        rows.append(
            {
                "system": "a peer",
                "n": n,
                "steps_per_s": rate * n / 2,
                "ideal": 2 * rate * n,
                "percent_of_ideal": 25.0,
            }
        )
        print(f"measured N={n}", flush=True)
    rows.append({"system": "aenvs process (cold zygote)", "seconds": 0.25, "worker_uss_mb": [6.0, 6.5]})
    return rows


def crash() -> list[object]:
    print("about to fail", flush=True)
    raise RuntimeError("the env would not start")


def hang() -> list[object]:
    print("waiting forever", flush=True)
    threading.Event().wait()
    return []


def _answer() -> int:
    return 42


def pickled_factory() -> list[object]:
    """Whether one of this module's functions unpickles in a fresh interpreter that cannot
    import this module (as a worker process that must not import a whole benchmark)."""
    import subprocess
    import sys

    import cloudpickle

    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import cloudpickle, sys; print(cloudpickle.loads(sys.stdin.buffer.read())())",
        ],
        input=cloudpickle.dumps(_answer),
        capture_output=True,
        cwd="/",
        timeout=60,
    )
    return [{"returncode": done.returncode, "stdout": done.stdout.decode().strip()}]
