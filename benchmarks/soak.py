"""Soak: 10^6 CartPole steps per executor with 100 forced restarts; does anything grow?

Every 10^5 steps it samples the parent's and the workers' resident memory, open file
descriptors (parent and workers), the parent's threads and the entries in /dev/shm,
and at the end prints each series' slope per 10^6 steps (after the first sample, the
warm-up). Restarts alternate between an env exception (the env is rebuilt in place) and,
where the executor has workers to lose, a stopped worker (a new one replaces it).
On ray, the local Ray instance's own processes (GCS, raylet, log monitor, agents) are
sampled apart from the actors hosting the envs: their bookkeeping grows with every actor
ever started (the GCS keeps dead actors' records, the log monitor opens each new
worker's log files, up to its RAY_LOG_MONITOR_MAX_OPEN_FILES), which is Ray's, not aenvs'.

    python benchmarks/soak.py                       # inline, thread, process (and ray): 10^6 steps each
    python benchmarks/soak.py --steps 200000 --executors process
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field

# a Ray instance the ray executor starts stays on loopback (read when ray is imported)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import psutil
import torch

from aenvs import AsyncEnvPool, EnvError


@dataclass
class Sample:
    steps: int
    parent_rss_mb: float
    workers_rss_mb: float
    fds: int
    threads: int
    shm_entries: int
    ray_system_rss_mb: float = 0.0  # Ray's own processes (GCS, raylet, log monitor, agents)
    ray_system_fds: int = 0


@dataclass
class Run:
    executor: str
    samples: list[Sample] = field(default_factory=list)
    restarts: int = 0
    env_restarts: int = 0
    seconds: float = 0.0


def _is_ray_system(process: psutil.Process) -> bool:
    """One of the processes of a local Ray instance itself, not an actor hosting envs."""
    command = " ".join(process.cmdline())
    return "ray" in command and "ray::EnvHost" not in command


def _sample(steps: int) -> Sample:
    """Memory and fds of this process and its workers (processes or actors hosting envs),
    and, apart, of the local Ray instance's own processes, whose bookkeeping grows with
    every actor ever started (the GCS's tables, the log monitor's open files)."""
    me = psutil.Process()
    workers_rss = ray_rss = 0
    fds, ray_fds = me.num_fds(), 0
    for child in me.children(recursive=True):
        try:
            rss, child_fds = child.memory_info().rss, child.num_fds()
            if _is_ray_system(child):
                ray_rss += rss
                ray_fds += child_fds
            else:
                workers_rss += rss
                fds += child_fds
        except psutil.NoSuchProcess:
            continue
    shm = len(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else 0
    return Sample(
        steps,
        me.memory_info().rss / 2**20,
        workers_rss / 2**20,
        fds,
        me.num_threads(),
        shm,
        ray_rss / 2**20,
        ray_fds,
    )


async def _force_restart(pool: AsyncEnvPool, env: int, stop_worker: bool) -> None:
    """Make env ``env`` fail once, so that on_error="restart" rebuilds it."""
    if stop_worker:
        pool.executor.abort([env])  # its worker dies; the next command to it is a crash
    else:
        await pool.set_attr("state", None, env_index=[env])  # CartPole's step raises on None


async def soak(executor: str, num_envs: int, total_steps: int, restarts: int, every: int) -> Run:
    run = Run(executor)
    iterations = total_steps // num_envs
    restart_every = max(iterations // (restarts + 1), 1)
    can_stop_workers = executor in ("thread", "process", "ray")
    actions = torch.arange(num_envs) % 2
    async with AsyncEnvPool(
        "CartPole-v1",
        num_envs=num_envs,
        executor=executor,
        on_error="restart",
        max_restarts=restarts,
        restart_backoff=0.0,
        seed=0,
    ) as pool:
        td = await pool.reset()
        start = time.perf_counter()
        run.samples.append(_sample(0))
        next_sample = every
        for it in range(1, iterations + 1):
            if it % restart_every == 0 and run.restarts < restarts:
                env = run.restarts % num_envs
                await _force_restart(pool, env, stop_worker=can_stop_workers and run.restarts % 2 == 1)
                run.restarts += 1
            td["action"] = actions
            try:
                _, td = await pool.step_and_maybe_reset(td)
            except EnvError:
                td = await pool.reset()  # waits for the restarted env
            if it * num_envs >= next_sample:
                gc.collect()
                run.samples.append(_sample(it * num_envs))
                next_sample += every
        run.seconds = time.perf_counter() - start
        # a stopped worker takes every env it hosts down with it: each of them is rebuilt
        run.env_restarts = sum(pool.stats().restarts)
        assert run.env_restarts >= run.restarts, pool.stats().restarts
    return run


def _slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def report(run: Run) -> dict[str, float]:
    warm = run.samples[1:]  # the first sample is before warm-up
    per_million = [s.steps / 1e6 for s in warm]
    names = ["parent_rss_mb", "workers_rss_mb", "fds", "threads", "shm_entries"]
    with_ray = any(s.ray_system_rss_mb for s in run.samples)
    if with_ray:
        names += ["ray_system_rss_mb", "ray_system_fds"]
    slopes = {name: _slope(per_million, [float(getattr(s, name)) for s in warm]) for name in names}
    steps = run.samples[-1].steps
    print(
        f"\n{run.executor}: {steps:,} steps in {run.seconds:.0f} s ({steps / run.seconds:,.0f} steps/s), "
        f"{run.restarts} forced restarts ({run.env_restarts} envs rebuilt)"
    )
    ray_header = f" {'Ray MB':>8} {'Ray fds':>8}" if with_ray else ""
    print(
        f"  {'steps':>9} {'parent MB':>10} {'workers MB':>11} {'fds':>5} {'threads':>8} {'/dev/shm':>9}"
        + ray_header
    )
    for s in run.samples:
        ray_cells = f" {s.ray_system_rss_mb:>8.1f} {s.ray_system_fds:>8}" if with_ray else ""
        print(
            f"  {s.steps:>9,} {s.parent_rss_mb:>10.1f} {s.workers_rss_mb:>11.1f} {s.fds:>5} {s.threads:>8} "
            f"{s.shm_entries:>9}" + ray_cells
        )
    print("  slope per 10^6 steps after warm-up: " + ", ".join(f"{k} {v:+.2f}" for k, v in slopes.items()))
    return slopes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    with_ray = importlib.util.find_spec("ray") is not None
    parser.add_argument(
        "--executors", nargs="+", default=["inline", "thread", "process", *(["ray"] if with_ray else [])]
    )
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--restarts", type=int, default=100)
    parser.add_argument("--every", type=int, default=100_000)
    parser.add_argument("--json", help="write the samples and slopes here")
    args = parser.parse_args()
    results = {}
    for executor in args.executors:
        run = asyncio.run(soak(executor, args.num_envs, args.steps, args.restarts, args.every))
        results[executor] = {"run": asdict(run), "slopes": report(run)}
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    ok = all(r["slopes"]["parent_rss_mb"] + r["slopes"]["workers_rss_mb"] < 10 for r in results.values())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
