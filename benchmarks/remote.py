"""Remote envs on Ray: aenvs' ray executor against a naive one-actor-per-env ``ray.get`` loop.

Two workloads, N = 8 and 64 envs each, on one local Ray instance (2 CPUs here):

- latency: a gymnasium env whose step blocks in ``time.sleep(10 ms)`` (a remote simulator,
  a robot, a web tool); the ideal is N / 10 ms steps/s;
- cpu: about 1 ms of numpy per step (48x48 matmuls, single-threaded), as in throughput.py;
  the ideal is the machine's cores / 1 ms.

Systems, each stepping random actions with auto-reset:

- aenvs ray: ``executor="ray"`` with its defaults (one actor per CPU of the cluster, the
  envs of an actor stepped on threads of their own), in the overlapped loop an async
  trainer runs: receive whatever finished (``min_get=1``), re-send those envs at once;
- aenvs ray, lockstep: the same pool, ``step_and_maybe_reset`` on the whole batch;
- naive ray.get loop: one Ray actor per env (what RLlib's remote envs do), every step
  ``ray.get([actor.step.remote(action) for each env])``;
- aenvs process (for reference, no Ray): ``executor="process"``, one worker per core,
  in the overlapped loop.

Every row runs ``--duration`` seconds after a warm-up; steps/s counts env steps, and CPU
us/step is this (driver) process's CPU time per step (the actors' CPU is not in it).

    python benchmarks/remote.py [--duration 3] [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

# this benchmark's Ray instance stays on loopback (read when ray is imported)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import gymnasium as gym
import numpy as np
import torch
import uvloop

import aenvs
from aenvs import AsyncEnvPool

LATENCY = 0.010
CPU_ROUNDS = 40  # 48x48 matmuls per step: calibrated to about 1 ms below
NS = (8, 64)
WARMUP = 0.5
RAY_CPUS = os.cpu_count() or 1
DEFAULT_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "remote.json")


# -- the envs (gymnasium: the actors hosting them import no torch) ----------------------------


class SleepyEnv(gym.Env[np.ndarray, np.int64]):
    """A step that waits 10 ms on something else (``time.sleep``), like a remote simulator."""

    observation_space = gym.spaces.Box(-1, 1, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, episode_length: int = 200) -> None:
        self.episode_length = episode_length
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        time.sleep(LATENCY)
        self.t += 1
        return np.full(4, float(action), np.float32), 1.0, False, self.t >= self.episode_length, {}


class CpuBoundEnv(gym.Env[np.ndarray, np.int64]):
    """About 1 ms of numpy per step: ``rounds`` 48x48 matmuls (fixed work, not a deadline)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (8,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, rounds: int = CPU_ROUNDS, episode_length: int = 200) -> None:
        self.rounds = rounds
        self.episode_length = episode_length
        rng = np.random.default_rng(0)
        self.a, self.b = rng.standard_normal((48, 48)), rng.standard_normal((48, 48))
        self.c = np.empty((48, 48))
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(8, np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        for _ in range(self.rounds):
            np.matmul(self.a, self.b, out=self.c)
        self.t += 1
        return (
            (self.c[0, :8] + float(action)).astype(np.float32),
            1.0,
            False,
            self.t >= self.episode_length,
            {},
        )


def calibrate_rounds(target: float = 0.001) -> int:
    """Matmul rounds that take about ``target`` seconds here (single-threaded numpy)."""
    env = CpuBoundEnv(rounds=200)
    env.reset()
    best = float("inf")
    for _ in range(5):  # the fastest of a few tries: another job's load only ever slows one down
        start = time.perf_counter()
        for _ in range(5):
            env.step(0)
        best = min(best, time.perf_counter() - start)
    per_round = best / (5 * 200)
    return max(1, round(target / per_round))


WORKLOADS: dict[str, tuple[str, Callable[[int], Callable[[], gym.Env]]]] = {
    "latency": ("10 ms latency env (time.sleep)", lambda rounds: SleepyEnv),
    "cpu": ("CPU-bound env (~1 ms of numpy)", lambda rounds: lambda: CpuBoundEnv(rounds)),
}


# -- measuring ---------------------------------------------------------------------------------


@dataclass
class Row:
    workload: str
    system: str
    n: int
    steps_per_s: float
    ideal: float
    percent_of_ideal: float
    cpu_us_per_step: float


def ideal(workload: str, n: int) -> float:
    return n / LATENCY if workload == "latency" else RAY_CPUS / 0.001


def make_row(workload: str, system: str, n: int, steps: int, wall: float, cpu: float) -> Row:
    rate, best = steps / wall, ideal(workload, n)
    return Row(workload, system, n, rate, best, 100 * rate / best, 1e6 * cpu / max(steps, 1))


async def window(advance: Callable[[], Awaitable[int]], duration: float) -> tuple[int, float, float]:
    """Run ``advance`` (it returns the steps it saw) through a warm-up, then for ``duration``
    seconds: (steps, wall seconds, CPU seconds of this process) of the measured part."""
    deadline = time.perf_counter() + WARMUP
    while time.perf_counter() < deadline:
        await advance()
    steps = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < duration:
        steps += await advance()
    return steps, time.perf_counter() - t0, time.process_time() - cpu0


async def pool_rows(
    workload: str, env_fn: Callable[[], gym.Env], n: int, executor: str, duration: float, lockstep: bool
) -> list[Row]:
    """The overlapped loop (and, if asked, the lockstep loop) on one pool."""
    rows = []
    async with AsyncEnvPool([env_fn] * n, executor=executor) as pool:
        td = await pool.reset()
        zeros = torch.zeros(n, dtype=torch.int64)
        td["action"] = zeros
        await pool.async_step_and_maybe_reset_send(td)

        async def overlapped() -> int:
            out, next_td = await pool.async_step_and_maybe_reset_recv(min_get=1)
            next_td["action"] = torch.randint(0, 2, (next_td.batch_size[0],))
            await pool.async_step_and_maybe_reset_send(next_td)
            return out.batch_size[0]

        steps, wall, cpu = await window(overlapped, duration)
        rows.append(make_row(workload, f"aenvs {executor}", n, steps, wall, cpu))
        await pool.async_step_and_maybe_reset_recv(min_get=n)  # what is still in flight
        if lockstep:
            td = await pool.reset()

            async def whole_batch() -> int:
                nonlocal td
                td["action"] = torch.randint(0, 2, (n,))
                _, td = await pool.step_and_maybe_reset(td)
                return n

            steps, wall, cpu = await window(whole_batch, duration)
            rows.append(make_row(workload, f"aenvs {executor}, lockstep", n, steps, wall, cpu))
    return rows


def naive_actors(n: int) -> list[Any]:
    """N Ray actors that each host one env (what RLlib's remote envs do), built later by
    :func:`naive_row`; one set serves every workload, as starting an actor is most of the
    naive loop's set-up."""
    import ray

    @ray.remote
    class RemoteEnv:
        def build(self, env_fn: Callable[[], gym.Env]) -> Any:
            self.env = env_fn()
            return self.env.reset()[0]

        def step(self, action: int) -> tuple[Any, float, bool]:
            obs, reward, terminated, truncated, _ = self.env.step(action)
            if terminated or truncated:
                obs, _ = self.env.reset()
            return obs, float(reward), terminated or truncated

        def ready(self) -> None:
            return None

    actors = [RemoteEnv.remote() for _ in range(n)]
    ray.get([a.ready.remote() for a in actors])  # started, not starting while others are measured
    return actors


def naive_row(workload: str, env_fn: Callable[[], gym.Env], actors: list[Any], duration: float) -> Row:
    """One Ray actor per env, lockstep: ``ray.get`` on every env's step (RLlib's remote envs)."""
    import ray

    n = len(actors)
    ray.get([a.build.remote(env_fn) for a in actors])
    rng = np.random.default_rng(0)

    def advance() -> int:
        actions = rng.integers(0, 2, n)
        ray.get([a.step.remote(int(x)) for a, x in zip(actors, actions, strict=True)])
        return n

    deadline = time.perf_counter() + WARMUP
    while time.perf_counter() < deadline:
        advance()
    steps = 0
    cpu0, t0 = time.process_time(), time.perf_counter()
    while time.perf_counter() - t0 < duration:
        steps += advance()
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return make_row(workload, "naive ray.get loop (actor per env)", n, steps, wall, cpu)


def run(duration: float = 3.0, quick: bool = False, progress: Callable[[str], None] = print) -> list[Row]:
    """Every row of the benchmark, measured side by side on one local Ray instance.

    ``quick``: N = 8 only and 1 s per row (a smoke run, not figures to quote).
    """
    import ray

    if quick:
        duration = min(duration, 1.0)
    ns = NS[:1] if quick else NS
    rounds = calibrate_rounds()
    started_ray = not ray.is_initialized()
    temp_dir = tempfile.mkdtemp(prefix="aenvs-")  # Ray's logs and sockets, removed afterwards
    if started_ray:
        ray.init(
            address="local",
            num_cpus=RAY_CPUS,
            include_dashboard=False,
            logging_level=logging.ERROR,
            _temp_dir=temp_dir,
        )
    if __name__ != "__main__":
        # run as a module (by aenvs bench), as when run as a script: its envs travel to the
        # actors by value, so that an actor does not import this module (and torch with it)
        from ray import cloudpickle as ray_cloudpickle

        ray_cloudpickle.register_pickle_by_value(sys.modules[__name__])
    rows: list[Row] = []
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            for n in ns:
                actors = naive_actors(n)
                try:
                    for workload, (_, make) in WORKLOADS.items():
                        env_fn = make(rounds)
                        rows += runner.run(pool_rows(workload, env_fn, n, "ray", duration, lockstep=True))
                        rows.append(naive_row(workload, env_fn, actors, duration))
                        rows += runner.run(
                            pool_rows(workload, env_fn, n, "process", duration, lockstep=False)
                        )
                        progress(f"  done: {workload} N={n}")
                finally:
                    for a in actors:
                        ray.kill(a)  # pyright: ignore[reportArgumentType]
    finally:
        if started_ray:
            ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
    return rows


# -- reporting ---------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    lines = [
        "| workload | system | N | steps/s | ideal | % of ideal | driver CPU us/step |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {WORKLOADS[r.workload][0]} | {r.system} | {r.n} | {r.steps_per_s:,.0f} | {r.ideal:,.0f} "
        f"| {r.percent_of_ideal:.1f}% | {r.cpu_us_per_step:.0f} |"
        for r in rows
    ]
    return "\n".join(lines)


def ratios(rows: list[Row]) -> list[str]:
    """aenvs ray (overlapped) against the naive loop, per workload and N."""
    out = []
    for workload in WORKLOADS:
        for n in sorted({r.n for r in rows}):
            ours = [r for r in rows if (r.workload, r.n, r.system) == (workload, n, "aenvs ray")]
            naive = [r for r in rows if r.workload == workload and r.n == n and r.system.startswith("naive")]
            if ours and naive:
                out.append(
                    f"{workload} N={n}: aenvs ray / naive = {ours[0].steps_per_s / naive[0].steps_per_s:.2f}x"
                )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per row")
    parser.add_argument("--quick", action="store_true", help="N = 8 only, 1 s per row (smoke run)")
    parser.add_argument("--json", default=DEFAULT_JSON, help="where to write the results")
    args = parser.parse_args()

    import ray

    print(f"Ray {ray.__version__}, {RAY_CPUS} CPUs, {args.duration:g} s per row", flush=True)
    rows = run(args.duration, args.quick)
    setup = {
        "command": " ".join(["python", *sys.argv]),
        "duration_s": args.duration,
        "quick": args.quick,
        "latency_s": LATENCY,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "aenvs": aenvs.__version__,
        "ray": ray.__version__,
        "torch": torch.__version__,
    }
    print(", ".join(f"{k}={v}" for k, v in setup.items()))
    print(table(rows))
    for line in ratios(rows):
        print(line)
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({**setup, "rows": [asdict(r) for r in rows]}, f, indent=2)
        f.write("\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
