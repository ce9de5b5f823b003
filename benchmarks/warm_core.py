"""What the pool costs on a warm core and on one that idles between cohorts (inline executor).

Two measurements, side by side with their bare references in one run (uvloop):

- loop-bound: coroutine envs whose step yields to the loop once (``asyncio.sleep(0)``),
  in the latency benchmark's overlapped loop (receive what finished, re-send it at once).
  The loop never idles, so this is the pool's own CPU per step with warm caches, against
  N bare tasks that only yield (full GCs: CPython's full collections in the pool's window,
  0.1-0.2 s each here as they walk every object torch loaded);
- same-core spinner (Linux): the latency benchmark's inline N=256 rows (10 ms envs),
  this process pinned to one CPU, alternately alone and with a ``nice 19`` busy loop
  pinned to the same CPU. The spinner takes no time the loop wants (it runs only when the
  loop would sleep) but keeps the CPU from halting, which shows what halting between
  cohorts costs the pool's code.

    python benchmarks/warm_core.py [--pairs 3] [--duration 3] [--no-spinner]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import torch
import uvloop
from tensordict import TensorDictBase

from aenvs import AsyncEnvPool

try:
    from . import latency
except ImportError:  # run as a script (python benchmarks/warm_core.py): its own folder is on the path
    import latency

LOOP_BOUND_NS = (64, 256, 1024)


class YieldingEnv(latency.AsyncSleepyEnv):
    """The latency benchmark's env with its sleep shortened to one yield to the loop."""

    async def step(self, td: TensorDictBase) -> dict[str, Any]:  # pyright: ignore[reportIncompatibleMethodOverride]
        await asyncio.sleep(0)
        return {"observation": latency.OBSERVATION, "reward": 0.0, "terminated": False}


async def loop_bound_pool(n: int, duration: float) -> tuple[float, float, int]:
    """CPU us per step of the overlapped loop over N yielding envs, the mean batch received,
    and CPython's full collections in the window."""
    async with AsyncEnvPool([YieldingEnv] * n, executor="inline") as pool:
        td = await pool.reset()
        td["action"] = torch.zeros(n, dtype=torch.int64)
        await pool.async_step_send(td)
        steps = receives = 0
        start = time.perf_counter()
        while time.perf_counter() - start < latency.WARMUP:
            out = await pool.async_step_recv(min_get=1)
            await pool.async_step_send(out.select("action", "env_index"))
        full0 = gc.get_stats()[2]["collections"]
        cpu0, t0 = time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < duration:
            out = await pool.async_step_recv(min_get=1)
            await pool.async_step_send(out.select("action", "env_index"))
            steps += out.batch_size[0]
            receives += 1
        cpu, full = time.process_time() - cpu0, gc.get_stats()[2]["collections"] - full0
        await pool.async_step_recv(min_get=n)
    return 1e6 * cpu / steps, steps / receives, full


async def loop_bound_bare(n: int, duration: float) -> float:
    """CPU us per step of N bare tasks that only yield to the loop."""
    done = 0

    async def yielder() -> None:
        nonlocal done
        while True:
            await asyncio.sleep(0)
            done += 1

    tasks = [asyncio.create_task(yielder()) for _ in range(n)]
    await asyncio.sleep(latency.WARMUP)
    before, cpu0 = done, time.process_time()
    await asyncio.sleep(duration)
    cpu, steps = time.process_time() - cpu0, done - before
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return 1e6 * cpu / steps


async def loop_bound(duration: float) -> list[str]:
    lines = [
        "| N | pool CPU us/step | bare tasks CPU us/step | pool's own us/step | mean batch | full GCs |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n in LOOP_BOUND_NS:
        bare = await loop_bound_bare(n, duration)
        pool, batch, full = await loop_bound_pool(n, duration)
        lines.append(f"| {n} | {pool:.2f} | {bare:.2f} | {pool - bare:.2f} | {batch:.0f} | {full} |")
    return lines


def _spinner(cpu: int) -> subprocess.Popen[bytes]:
    code = f"import os; os.sched_setaffinity(0, {{{cpu}}}); os.nice(19)\nwhile True: pass"
    return subprocess.Popen([sys.executable, "-c", code])


async def _latency_256(duration: float) -> tuple[float, float, float, float]:
    """(% of ideal, CPU us/step) of the inline N=256 pool row, then of its bare reference."""
    window = latency.Window(duration)
    pool = await latency.pool_row("inline", 256, window)
    bare = await latency.bare_tasks_row(256, window)
    return pool.percent_of_ideal, pool.cpu_us_per_step, bare.percent_of_ideal, bare.cpu_us_per_step


async def spinner_pairs(pairs: int, duration: float) -> list[str]:
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    results: dict[bool, list[tuple[float, float, float, float]]] = {False: [], True: []}
    for _ in range(pairs):
        for spin in (False, True):
            spinner = _spinner(cpu) if spin else None
            try:
                results[spin].append(await _latency_256(duration))
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
    lines = [
        f"CPU {cpu}, {pairs} alternating pairs, medians:",
        "| core | pool % of ideal | pool CPU us/step | bare % of ideal | bare CPU us/step |",
        "|---|---:|---:|---:|---:|",
    ]
    for spin, label in ((False, "idles between cohorts"), (True, "kept busy by a nice-19 spinner")):
        columns = [statistics.median(r[k] for r in results[spin]) for k in range(4)]
        lines.append(
            f"| {label} | {columns[0]:.1f}% | {columns[1]:.1f} | {columns[2]:.1f}% | {columns[3]:.1f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per row")
    parser.add_argument("--pairs", type=int, default=3, help="alternating pairs of spinner rows")
    parser.add_argument("--no-spinner", action="store_true", help="only the loop-bound rows")
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        print("loop-bound (envs that yield once; the loop never idles):", flush=True)
        print("\n".join(runner.run(loop_bound(min(args.duration, 1.0)))), flush=True)
        if not args.no_spinner and hasattr(os, "sched_setaffinity"):
            print("latency benchmark, inline N=256, 10 ms envs:", flush=True)
            print("\n".join(runner.run(spinner_pairs(args.pairs, args.duration))))


if __name__ == "__main__":
    main()
