"""Latency benchmark: N envs whose step takes L = 10 ms, against the ideal N / L.

inline: a coroutine env (`await asyncio.sleep(L)`), all N in flight on the loop.
thread: a plain env (`time.sleep(L)`), one thread per env.
Each pool runs the overlapped loop: receive whatever finished (min_get=1), re-send those
envs at once. Beside each, in the same run, the bare reference: N asyncio tasks that only
sleep (inline), N threads of a ThreadPoolExecutor that only sleep (thread).

overhead_us is the pool's own CPU per step: CPU seconds of this process over the
measured window divided by the steps taken, minus the same figure for the bare reference.

    python benchmarks/latency.py [--duration 3] [--loop uvloop|asyncio] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import platform
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
import uvloop
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from aenvs import AsyncEnvPool, Env

LATENCY = 0.010


OBSERVATION = np.zeros(1, np.float32)


class SleepyEnv(Env):
    """A plain env whose step blocks for LATENCY seconds; it returns a plain dict (cheap to build)."""

    observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed=None, options=None) -> TensorDictBase:
        return TensorDict(observation=torch.zeros(1))

    def step(self, td: TensorDictBase) -> dict:  # type: ignore[override]
        time.sleep(LATENCY)
        return {"observation": OBSERVATION, "reward": 0.0, "terminated": False}


class AsyncSleepyEnv(SleepyEnv):
    """The same env, awaiting instead of blocking."""

    async def step(self, td: TensorDictBase) -> dict:  # type: ignore[override]
        await asyncio.sleep(LATENCY)
        return {"observation": OBSERVATION, "reward": 0.0, "terminated": False}


@dataclass
class Row:
    system: str
    n: int
    steps_per_s: float
    ideal: float
    percent_of_ideal: float
    cpu_us_per_step: float
    overhead_us: float = 0.0


async def measure(loop_body: Callable[[], Awaitable[int]], duration: float) -> tuple[float, float]:
    """Run ``loop_body`` (returns steps done per call) for ``duration`` seconds: (steps/s, CPU us/step)."""
    deadline = time.perf_counter() + 0.3  # warm-up
    while time.perf_counter() < deadline:
        await loop_body()
    steps = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < duration:
        steps += await loop_body()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return steps / wall, cpu / max(steps, 1) * 1e6


async def pool_row(executor: str, n: int, duration: float) -> Row:
    env = AsyncSleepyEnv if executor == "inline" else SleepyEnv
    async with AsyncEnvPool([env] * n, executor=executor) as pool:
        td = await pool.reset()
        td["action"] = torch.zeros(n, dtype=torch.int64)
        await pool.async_step_send(td)

        async def body() -> int:
            out = await pool.async_step_recv(min_get=1)
            await pool.async_step_send(out.select("action", "env_index"))
            return out.batch_size[0]

        rate, cpu = await measure(body, duration)
        await pool.async_step_recv(min_get=n)
    ideal = n / LATENCY
    return Row(f"aenvs {executor}", n, rate, ideal, 100 * rate / ideal, cpu)


async def bare_tasks_row(n: int, duration: float) -> Row:
    """N tasks that only sleep: what the loop itself allows."""
    done = 0

    async def sleeper() -> None:
        nonlocal done
        while True:
            await asyncio.sleep(LATENCY)
            done += 1

    tasks = [asyncio.create_task(sleeper()) for _ in range(n)]

    async def body() -> int:
        before = done
        await asyncio.sleep(0.05)
        return done - before

    rate, cpu = await measure(body, duration)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return Row("bare asyncio tasks", n, rate, n / LATENCY, 100 * rate * LATENCY / n, cpu)


async def bare_threads_row(n: int, duration: float) -> Row:
    """N threads that only sleep, each job re-submitted on completion."""
    loop = asyncio.get_running_loop()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        pending = {loop.run_in_executor(pool, time.sleep, LATENCY) for _ in range(n)}

        async def body() -> int:
            nonlocal pending
            finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending |= {loop.run_in_executor(pool, time.sleep, LATENCY) for _ in finished}
            return len(finished)

        rate, cpu = await measure(body, duration)
        await asyncio.wait(pending)
    return Row("bare ThreadPoolExecutor", n, rate, n / LATENCY, 100 * rate * LATENCY / n, cpu)


def gymnasium_async_row(n: int, duration: float) -> Row | None:
    """gymnasium's AsyncVectorEnv (lockstep) on the time.sleep env, where it runs."""
    try:
        import gymnasium as gym

        class Sleepy(gym.Env):
            observation_space = spaces.Box(-1, 1, (1,), np.float32)
            action_space = spaces.Discrete(2)

            def reset(self, *, seed=None, options=None):
                return np.zeros(1, np.float32), {}

            def step(self, action):
                time.sleep(LATENCY)
                return np.zeros(1, np.float32), 0.0, False, False, {}

        envs = gym.vector.AsyncVectorEnv([Sleepy] * n, shared_memory=True, context="fork")
    except Exception as exc:  # an optional peer: report and go on
        print(f"gymnasium AsyncVectorEnv skipped: {exc!r}")
        return None
    try:
        envs.reset(seed=0)
        actions = np.zeros(n, np.int64)
        steps = 0
        t0, cpu0 = time.perf_counter(), time.process_time()
        while time.perf_counter() - t0 < duration:
            envs.step(actions)
            steps += n
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        envs.close()
    rate = steps / wall
    return Row("gymnasium AsyncVectorEnv", n, rate, n / LATENCY, 100 * rate * LATENCY / n, cpu / steps * 1e6)


async def run(duration: float) -> list[Row]:
    rows: list[Row] = []
    for n in (64, 256, 1024):
        bare = await bare_tasks_row(n, duration)
        pool = await pool_row("inline", n, duration)
        pool.overhead_us = pool.cpu_us_per_step - bare.cpu_us_per_step
        rows += [pool, bare]
    for n in (64, 256):
        bare = await bare_threads_row(n, duration)
        pool = await pool_row("thread", n, duration)
        pool.overhead_us = pool.cpu_us_per_step - bare.cpu_us_per_step
        rows += [pool, bare]
    return rows


def table(rows: list[Row]) -> str:
    lines = [
        "| system | N | steps/s | ideal N/L | % of ideal | CPU us/step | pool overhead us/step |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        overhead = f"{r.overhead_us:.1f}" if r.system.startswith("aenvs") else ""
        lines.append(
            f"| {r.system} | {r.n} | {r.steps_per_s:,.0f} | {r.ideal:,.0f} | {r.percent_of_ideal:.1f}% "
            f"| {r.cpu_us_per_step:.1f} | {overhead} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per row")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results", "latency.json"))
    args = parser.parse_args()
    factory = uvloop.new_event_loop if args.loop == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        rows = runner.run(run(args.duration))
    peer = gymnasium_async_row(64, args.duration)
    if peer is not None:
        rows.append(peer)
    print(
        f"L = {LATENCY * 1e3:.0f} ms, loop: {args.loop}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(table(rows))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"latency_s": LATENCY, "loop": args.loop, "rows": [asdict(r) for r in rows]}, f, indent=2)


if __name__ == "__main__":
    main()
