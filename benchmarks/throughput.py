"""Throughput: aenvs against gymnasium, TorchRL and EnvPool on the same work, in one run.

Random actions (drawn from a pre-generated pool), auto-reset, env steps per second:

- cartpole: CartPole-v1, cheap steps, N = 2, 8, 32;
- cpu: about 1 ms of numpy per step (48x48 matmuls, below OpenBLAS's threading threshold,
  so single-threaded in every process), Discrete(2) actions, an 8-float observation,
  N = 2, 8, 32;
- pixels: uint8 4x84x84 observations, cheap steps, N = 8, 32;
- vector: gymnasium's vector API on CartPole-v1, N = 4, 16: ``envs.step`` of
  ``aenvs.gymnasium.AsyncVectorEnv`` on each executor beside gymnasium's own vector envs
  (``us_per_call``: microseconds per ``envs.step``);
- startup: seconds from constructing 8 worker processes (CartPole-v1) to the first reset,
  and the workers' unique memory (USS).

References, per workload: one env stepped in a plain Python loop ("bare loop (1 env)"), and
that rate times the cores ("bound"). Every row has the CPU of this process and its
descendants per env step (``cpu_us_per_step``) and that minus the bare loop's
(``own_cpu_us_per_step``): what the pool or peer itself spends per env step.

Systems:

- aenvs `process` (num_workers = os.cpu_count()), `thread` (one env per thread) and `inline`,
  each in two loops: lockstep (`step_and_maybe_reset` on the whole batch) and overlapped
  (`async_step_and_maybe_reset_recv(min_get=N // 2)`, re-send those envs at once; not for
  inline, where plain envs run one after the other anyway); on uvloop, as `aenvs run`;
- gymnasium `SyncVectorEnv` and `AsyncVectorEnv(shared_memory=True)` (default autoreset;
  context="fork", gymnasium's default on Linux, pinned because importing torchrl switches
  the global start method to spawn);
- TorchRL `ParallelEnv(N, GymEnv)` (its default start method, spawn; N = 8 only, as each
  worker imports torch) and `AsyncEnvPool(backend="multiprocessing", exchange="shm",
  envs_per_worker=N // os.cpu_count())`, both in a `step_and_maybe_reset` loop;
- EnvPool (CartPole-v1 only: it has no custom envs).

Every measurement runs for --duration seconds after a --warmup. A peer that fails to import
or start is left out, with the reason, in the report.

    python benchmarks/throughput.py [--duration S] [--only cartpole,cpu,pixels,startup]
                                    [--skip-peers torchrl,envpool,gymnasium] [--torch-threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import multiprocessing
import os
import platform
import sys
import time
import traceback
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
import torch

import aenvs
from aenvs import AsyncEnvPool
from aenvs.executors import ProcessExecutor

try:
    import uvloop
except ImportError:  # pragma: no cover
    uvloop = None

CPUS = os.cpu_count() or 1
ACTION_POOL = 64  # pre-generated random action batches, cycled
QUIET = 0.2  # cores used by other jobs below which a measurement counts as undisturbed
ATTEMPTS = 2  # measurements of a cell at most, while other jobs disturb it
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


# -- the envs ------------------------------------------------------------------------------


class CpuBoundEnv(gym.Env[np.ndarray, np.int64]):
    """About 1 ms of numpy per step: ``rounds`` 48x48 matmuls (fixed work, not a deadline)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (8,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, rounds: int, episode_length: int = 200) -> None:
        self.rounds = rounds
        self.episode_length = episode_length
        rng = np.random.default_rng(0)
        self.a = rng.standard_normal((48, 48))
        self.b = rng.standard_normal((48, 48))
        self.c = np.empty((48, 48))
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(8, np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        for _ in range(self.rounds):
            np.matmul(self.a, self.b, out=self.c)
        self.t += 1
        obs = (self.c[0, :8] + float(action)).astype(np.float32)
        return obs, 1.0, False, self.t >= self.episode_length, {}


class PixelsEnv(gym.Env[np.ndarray, np.int64]):
    """uint8 4x84x84 frames (28 KB), a cheap step: one row changes, the frame is copied out."""

    observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def __init__(self, episode_length: int = 500) -> None:
        self.episode_length = episode_length
        self.frame = np.zeros((4, 84, 84), np.uint8)
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self.frame[:] = 0
        return self.frame.copy(), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        self.frame[:, self.t % 84] = int(action) * 60
        return self.frame.copy(), 0.0, False, self.t >= self.episode_length, {}


def make_env(workload: str, rounds: int) -> gym.Env:
    """The env of a workload; module-level so that spawned TorchRL workers can unpickle it."""
    if workload == "cartpole":
        return gym.make("CartPole-v1")
    if workload == "cpu":
        return CpuBoundEnv(rounds)
    return PixelsEnv()


def make_torchrl_env(workload: str, rounds: int) -> Any:
    from torchrl.envs import GymEnv, GymWrapper

    if workload == "cartpole":
        return GymEnv("CartPole-v1")
    return GymWrapper(make_env(workload, rounds))


def calibrate_rounds(seconds: float = 0.001) -> tuple[int, float]:
    """Matmul rounds that take ``seconds`` on one core here, and the step time they give."""
    env = CpuBoundEnv(rounds=50)
    env.reset()
    for _ in range(20):
        env.step(np.int64(0))
    t0 = time.perf_counter()
    for _ in range(200):
        env.step(np.int64(0))
    rounds = max(1, round(50 * seconds / ((time.perf_counter() - t0) / 200)))
    env = CpuBoundEnv(rounds=rounds)
    env.reset()
    samples = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(50):
            env.step(np.int64(0))
        samples.append((time.perf_counter() - t0) / 50)
    return rounds, float(np.median(samples))


def _bare_worker(conn: Any, rounds: int, envs: int, duration: float, warmup: float) -> None:
    envs_ = [CpuBoundEnv(rounds) for _ in range(envs)]
    for env in envs_:
        env.reset()
    steps, t0 = 0, time.perf_counter()
    while (now := time.perf_counter()) - t0 < warmup + duration:
        for env in envs_:
            _, _, terminated, truncated, _ = env.step(np.int64(0))
            if terminated or truncated:
                env.reset()
        if now - t0 >= warmup:
            steps += len(envs_)
    conn.send(steps / (now - t0 - warmup))


def bare_processes(rounds: int, duration: float, warmup: float) -> float:
    """Steps/s of one bare process per core stepping 4 CPU-bound envs each: no IPC, no batching.
    What the machine gives when every core steps envs (the cores share caches and power)."""
    ctx = multiprocessing.get_context("fork")
    pipes = [ctx.Pipe(duplex=False) for _ in range(CPUS)]
    procs = [ctx.Process(target=_bare_worker, args=(w, rounds, 4, duration, warmup)) for _, w in pipes]
    for p in procs:
        p.start()
    total = sum(r.recv() for r, _ in pipes)
    for p in procs:
        p.join()
    return total


WORKLOADS: dict[str, tuple[str, tuple[int, ...], int]] = {  # name -> (title, N, action count)
    "cartpole": ("CartPole-v1 (cheap steps)", (2, 8, 32), 2),
    "cpu": ("CPU-bound env (~1 ms of numpy per step)", (2, 8, 32), 2),
    "pixels": ("Large observations (uint8 4x84x84, cheap steps)", (8, 32), 4),
}
TORCHRL_PARALLEL_SIZES = (8,)  # ParallelEnv spawns one torch-importing process per env


# -- measuring -------------------------------------------------------------------------------


@dataclass
class Row:
    workload: str
    system: str
    n: int
    steps_per_s: float
    foreign_cores: float  # cores busy outside this benchmark's processes meanwhile (shared machines)
    # CPU of this process and its descendants (workers, zygote) per env step over the window
    cpu_us_per_step: float | None = None
    startup_s: float | None = None
    # cpu_us_per_step minus the bare loop's (one env stepped in a plain Python loop): what the
    # pool (or peer) itself spends per env step, on every core together
    own_cpu_us_per_step: float | None = None
    us_per_call: float | None = None  # the vector workload: microseconds per envs.step


@dataclass
class Startup:
    system: str
    seconds: float
    worker_uss_mb: list[float] = field(default_factory=list)
    note: str = ""

    @property
    def uss_sum(self) -> float:
        return sum(self.worker_uss_mb)

    @property
    def uss_mean(self) -> float:
        return self.uss_sum / len(self.worker_uss_mb) if self.worker_uss_mb else float("nan")


@dataclass
class Run:
    duration: float
    warmup: float
    attempts: int = ATTEMPTS
    rows: list[Row] = field(default_factory=list)
    startup: list[Startup] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def cpu_sample() -> tuple[float, float, float]:
    """(time, busy core-seconds of the machine, core-seconds of this process and its descendants)."""
    t = psutil.cpu_times()
    busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
    busy += getattr(t, "steal", 0.0)
    me = psutil.Process()
    ours = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            c = p.cpu_times()
            ours += c.user + c.system
        except psutil.Error:
            pass
    return time.perf_counter(), busy, ours


def foreign_cores(start: tuple[float, float, float]) -> float:
    """Cores that other jobs used since ``start``: a cell measured beside them is suspect."""
    end = cpu_sample()
    return max(0.0, ((end[1] - start[1]) - (end[2] - start[2])) / (end[0] - start[0]))


def _measured(steps: int, elapsed: float, start: tuple[float, float, float]) -> tuple[float, float, float]:
    """(steps/s, foreign cores, our CPU us per step) of a window that began at ``start``."""
    ours = cpu_sample()[2] - start[2]
    return steps / elapsed, foreign_cores(start), 1e6 * ours / max(steps, 1)


def run_for(
    step: Callable[[], int], duration: float, warmup: float, attempts: int = ATTEMPTS
) -> tuple[float, float, float]:
    """Env steps per second of ``step`` (which returns the env steps it took) over ``duration``,
    the cores other jobs used meanwhile and our CPU microseconds per env step; measured again
    (up to ``attempts``) while other jobs are busy."""
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        step()
    best = (0.0, float("inf"), 0.0)
    for _ in range(attempts):
        steps, start = 0, cpu_sample()
        t0 = time.perf_counter()
        while (now := time.perf_counter()) - t0 < duration:
            steps += step()
        best = min(best, _measured(steps, now - t0, start), key=lambda m: m[1])
        if best[1] < QUIET:
            break
    return best


async def arun_for(
    step: Callable[[], Awaitable[int]], duration: float, warmup: float, attempts: int = ATTEMPTS
) -> tuple[float, float, float]:
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        await step()
    best = (0.0, float("inf"), 0.0)
    for _ in range(attempts):
        steps, start = 0, cpu_sample()
        t0 = time.perf_counter()
        while (now := time.perf_counter()) - t0 < duration:
            steps += await step()
        best = min(best, _measured(steps, now - t0, start), key=lambda m: m[1])
        if best[1] < QUIET:
            break
    return best


def uss_mb(pids: list[int]) -> list[float]:
    out = []
    for pid in pids:
        try:
            out.append(psutil.Process(pid).memory_full_info().uss / 2**20)
        except psutil.Error:
            pass
    return out


def run_async(coro: Awaitable[Any]) -> Any:
    """On uvloop where installed (what ``aenvs run`` uses), else asyncio's loop."""
    factory = uvloop.new_event_loop if uvloop is not None else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)  # pyright: ignore[reportArgumentType]


# -- aenvs -----------------------------------------------------------------------------------


async def aenvs_rows(workload: str, rounds: int, n: int, n_actions: int, run: Run) -> list[Row]:
    rows = []
    actions = [torch.randint(0, n_actions, (n,)) for _ in range(ACTION_POOL)]
    env_fn = functools.partial(make_env, workload, rounds)
    for name in ("process", "thread", "inline"):
        executor = ProcessExecutor(num_workers=CPUS) if name == "process" else name
        t0 = time.perf_counter()
        async with AsyncEnvPool([env_fn] * n, executor=executor) as pool:
            td = await pool.reset()
            startup = time.perf_counter() - t0
            k = 0

            async def lockstep() -> int:
                nonlocal td, k
                td["action"] = actions[k % ACTION_POOL]
                k += 1
                _, td = await pool.step_and_maybe_reset(td)
                return n

            measured = await arun_for(lockstep, run.duration, run.warmup, run.attempts)
            rows.append(Row(workload, f"aenvs {name} lockstep", n, *measured, startup))
            if name == "inline":
                continue
            td["action"] = actions[0]
            await pool.async_step_and_maybe_reset_send(td)

            async def overlapped() -> int:
                nonlocal k
                _, ready = await pool.async_step_and_maybe_reset_recv(min_get=max(1, n // 2))
                got = ready.batch_size[0]
                ready["action"] = actions[k % ACTION_POOL][:got]
                k += 1
                await pool.async_step_and_maybe_reset_send(ready)
                return got

            measured = await arun_for(overlapped, run.duration, run.warmup, run.attempts)
            rows.append(Row(workload, f"aenvs {name} overlapped", n, *measured, startup))
            await pool.async_step_and_maybe_reset_recv(min_get=n)
    return rows


# -- references ----------------------------------------------------------------------------------

BARE = "bare loop (1 env)"
BOUND = f"bare loop x {CPUS} cores (bound)"


def bare_rows(workload: str, rounds: int, sizes: Sequence[int], n_actions: int, run: Run) -> list[Row]:
    """One env stepped in a plain Python loop (random actions, auto-reset): what an env step
    costs by itself, and that rate times the cores, the machine's bound; one row per N (the
    same measurement) so that they read beside the pools'."""
    env = make_env(workload, rounds)
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    actions = [np.int64(a) for a in rng.integers(0, n_actions, ACTION_POOL)]
    k = 0

    def step() -> int:
        nonlocal k
        for _ in range(16):
            _, _, terminated, truncated, _ = env.step(actions[k % ACTION_POOL])
            k += 1
            if terminated or truncated:
                env.reset()
        return 16

    sps, foreign, cpu = run_for(step, run.duration, run.warmup, run.attempts)
    env.close()
    rows = [Row(workload, BARE, n, sps, foreign, cpu) for n in sizes]
    return rows + [Row(workload, BOUND, n, sps * CPUS, foreign) for n in sizes]


def vector_rows(sizes: Sequence[int], run: Run, peers: set[str]) -> list[Row]:
    """gymnasium's vector API on CartPole-v1: ``envs.step`` of aenvs's AsyncVectorEnv on each
    executor beside gymnasium's own vector envs (as CleanRL's scripts call it)."""
    from aenvs.gymnasium import AsyncVectorEnv

    env_fn = functools.partial(gym.make, "CartPole-v1")
    rows: list[Row] = []
    for n in sizes:
        factories: list[tuple[str, Callable[[], gym.vector.VectorEnv]]] = [
            (f"aenvs.gymnasium {name}", functools.partial(AsyncVectorEnv, [env_fn] * n, executor=name))
            for name in ("inline", "thread", "process")
        ]
        if "gymnasium" in peers:
            factories += [
                ("gymnasium SyncVectorEnv", functools.partial(gym.vector.SyncVectorEnv, [env_fn] * n)),
                (
                    "gymnasium AsyncVectorEnv",
                    functools.partial(
                        gym.vector.AsyncVectorEnv, [env_fn] * n, shared_memory=True, context="fork"
                    ),
                ),
            ]
        rng = np.random.default_rng(0)
        actions = [rng.integers(0, 2, n) for _ in range(ACTION_POOL)]
        for name, factory in factories:
            envs = factory()
            try:
                envs.reset(seed=0)
                sps, foreign, cpu = run_for(
                    _vector_stepper(envs, actions), run.duration, run.warmup, run.attempts
                )
                rows.append(Row("vector", name, n, sps, foreign, cpu, us_per_call=1e6 * n / sps))
            finally:
                envs.close()
    return rows


def _vector_stepper(envs: gym.vector.VectorEnv, actions: list[np.ndarray]) -> Callable[[], int]:
    k = 0

    def step() -> int:
        nonlocal k
        envs.step(actions[k % ACTION_POOL])
        k += 1
        return envs.num_envs

    return step


def own_cpu(rows: list[Row]) -> None:
    """Fill each row's ``own_cpu_us_per_step``: its CPU per env step minus the bare loop's."""
    bare = {r.workload: r.cpu_us_per_step for r in rows if r.system == BARE}
    bare["vector"] = bare.get("cartpole")
    for row in rows:
        reference = bare.get(row.workload)
        if row.system not in (BARE, BOUND) and reference is not None and row.cpu_us_per_step is not None:
            row.own_cpu_us_per_step = row.cpu_us_per_step - reference


# -- peers -------------------------------------------------------------------------------------


def gymnasium_rows(workload: str, rounds: int, n: int, n_actions: int, run: Run) -> list[Row]:
    rows = []
    env_fn = functools.partial(make_env, workload, rounds)
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, n_actions, n) for _ in range(ACTION_POOL)]
    factories: list[tuple[str, Callable[[], gym.vector.VectorEnv]]] = [
        ("gymnasium SyncVectorEnv", lambda: gym.vector.SyncVectorEnv([env_fn] * n)),
        (
            "gymnasium AsyncVectorEnv",
            lambda: gym.vector.AsyncVectorEnv([env_fn] * n, shared_memory=True, context="fork"),
        ),
    ]
    for name, factory in factories:
        t0 = time.perf_counter()
        envs = factory()
        try:
            envs.reset(seed=0)
            startup = time.perf_counter() - t0
            k = 0

            def step(envs: gym.vector.VectorEnv = envs) -> int:
                nonlocal k
                envs.step(actions[k % ACTION_POOL])
                k += 1
                return n

            rows.append(
                Row(workload, name, n, *run_for(step, run.duration, run.warmup, run.attempts), startup)
            )
        finally:
            envs.close()
    return rows


def torchrl_rows(workload: str, rounds: int, n: int, run: Run) -> list[Row]:
    from torchrl.envs import AsyncEnvPool as TorchRLAsyncEnvPool, ParallelEnv

    maker = functools.partial(make_torchrl_env, workload, rounds)
    factories: list[tuple[str, Callable[[], Any]]] = []
    if n in TORCHRL_PARALLEL_SIZES:
        factories.append(("torchrl ParallelEnv", lambda: ParallelEnv(n, maker)))
    factories.append(
        (
            "torchrl AsyncEnvPool",
            lambda: TorchRLAsyncEnvPool(  # pyright: ignore[reportAbstractUsage]
                [maker] * n,
                backend="multiprocessing",
                exchange="shm",
                envs_per_worker=max(1, n // CPUS),
            ),
        )
    )
    rows = []
    for name, factory in factories:
        try:
            rows.append(torchrl_row(workload, name, factory, n, run))
        except Exception as exc:
            run.skipped.append(f"{name} ({workload}, N={n}): {exc!r}")
            traceback.print_exc()
    return rows


def torchrl_row(workload: str, name: str, factory: Callable[[], Any], n: int, run: Run) -> Row:
    t0 = time.perf_counter()
    env = factory()
    try:
        td = env.reset()
        startup = time.perf_counter() - t0
        actions = [env.full_action_spec["action"].rand() for _ in range(ACTION_POOL)]  # one-hot
        k = 0

        def step() -> int:
            nonlocal td, k
            td.set("action", actions[k % ACTION_POOL])
            k += 1
            _, td = env.step_and_maybe_reset(td)
            return n

        return Row(workload, name, n, *run_for(step, run.duration, run.warmup, run.attempts), startup)
    finally:
        env.close()


def envpool_rows(workload: str, n: int, run: Run) -> list[Row]:
    import envpool  # pyright: ignore[reportMissingImports]

    t0 = time.perf_counter()
    envs = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=n, seed=0)
    envs.reset()
    startup = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    actions = [rng.integers(0, 2, n, dtype=np.int32) for _ in range(ACTION_POOL)]
    k = 0

    def step() -> int:
        nonlocal k
        envs.step(actions[k % ACTION_POOL])
        k += 1
        return n

    try:
        return [Row(workload, "envpool", n, *run_for(step, run.duration, run.warmup, run.attempts), startup)]
    finally:
        envs.close()


def guarded(what: str, run: Run, measure: Callable[..., list[Row]], *args: Any) -> list[Row]:
    """A peer's rows, or none and a note in the report when it fails."""
    try:
        return measure(*args)
    except Exception as exc:
        run.skipped.append(f"{what}: {exc!r}")
        traceback.print_exc()
        return []


# -- start-up ------------------------------------------------------------------------------------


def startup_rows(n: int, peers: set[str], run: Run) -> list[Startup]:
    out = []
    cartpole = functools.partial(make_env, "cartpole", 0)

    async def aenvs_start() -> tuple[float, list[float]]:
        t0 = time.perf_counter()
        executor = ProcessExecutor(num_workers=n)
        async with AsyncEnvPool([cartpole] * n, executor=executor) as pool:
            await pool.reset()
            seconds = time.perf_counter() - t0
            return seconds, uss_mb(executor.pids)

    for attempt in ("cold zygote", "warm zygote"):
        seconds, uss = run_async(aenvs_start())
        zygotes = [p.pid for p in psutil.Process().children() if "aenvs._zygote" in " ".join(p.cmdline())]
        note = f"+ zygote {uss_mb(zygotes)[0]:.1f} MB once per parent process" if zygotes else ""
        out.append(Startup(f"aenvs process ({attempt})", seconds, uss, note))

    if "gymnasium" in peers:
        t0 = time.perf_counter()
        envs = gym.vector.AsyncVectorEnv([cartpole] * n, shared_memory=True, context="fork")
        envs.reset(seed=0)
        seconds = time.perf_counter() - t0
        pids = [p.pid for p in envs.processes if p.pid is not None]
        out.append(Startup("gymnasium AsyncVectorEnv", seconds, uss_mb(pids)))
        envs.close()

    if "torchrl" in peers:
        try:
            from torchrl.envs import ParallelEnv

            before = {p.pid for p in psutil.Process().children(recursive=True)}
            t0 = time.perf_counter()
            env = ParallelEnv(n, functools.partial(make_torchrl_env, "cartpole", 0))
            env.reset()
            seconds = time.perf_counter() - t0
            kids = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
            # spawn also starts multiprocessing's resource tracker: count the env workers only
            workers = [p.pid for p in kids if "resource_tracker" not in " ".join(p.cmdline())]
            out.append(Startup("torchrl ParallelEnv (spawn)", seconds, uss_mb(workers)))
            env.close()
        except Exception as exc:
            run.skipped.append(f"torchrl ParallelEnv start-up: {exc!r}")
    return out


# -- the report ------------------------------------------------------------------------------------

REFERENCE = "aenvs process lockstep"


def find(rows: list[Row], workload: str, system: str, n: int) -> Row | None:
    return next((r for r in rows if (r.workload, r.system, r.n) == (workload, system, n)), None)


def tables(run: Run, meta: dict[str, Any]) -> str:
    lines = [
        "# Throughput: env steps per second (higher is better)",
        "",
        f"`{meta['command']}` on {meta['machine']}, {meta['wall_s'] / 60:.1f} min; {meta['versions']}; "
        f"torch threads in the benchmark process: {meta['torch_threads']}.",
        "",
        f"Each cell: {run.duration:g} s of stepping after {run.warmup:g} s of warm-up, random actions, auto-reset.",
        f"For a peer, `(r x)` = {REFERENCE} steps/s / that peer's steps/s: r > 1 means aenvs is r times faster.",
        f"† other jobs on the machine used >= {QUIET} cores during that cell (after {run.attempts} attempts).",
        "",
    ]
    vector = ("gymnasium vector API, CartPole-v1 (envs.step)", VECTOR_SIZES, 2)
    for workload, (title, sizes, _) in {**WORKLOADS, "vector": vector}.items():
        rows = [r for r in run.rows if r.workload == workload]
        if not rows:
            continue
        lines += [f"## {title}", ""]
        if workload == "cpu":
            lines += [
                f"One step = {meta['cpu_rounds']} 48x48 matmuls = {meta['cpu_step_ms']:.3f} ms on one core: "
                f"the {CPUS}-core bound is {meta['cpu_bound']:,.0f} steps/s. {CPUS} bare processes stepping "
                f"4 envs each (no IPC) reach {meta.get('cpu_bare', float('nan')):,.0f} steps/s.",
                "",
            ]
        lines += ["| system | " + " | ".join(f"N={n}" for n in sizes) + " |"]
        lines += ["|---|" + "---:|" * len(sizes)]
        systems = list(dict.fromkeys(r.system for r in rows))
        for system in systems:
            cells = []
            for n in sizes:
                row, ref = find(rows, workload, system, n), find(rows, workload, REFERENCE, n)
                if row is None:
                    cells.append("-")
                else:
                    cell = f"{row.steps_per_s:,.0f}" + ("†" if row.foreign_cores >= QUIET else "")
                    if not system.startswith("aenvs") and ref is not None:
                        cell += f" ({ref.steps_per_s / row.steps_per_s:.2f}x)"
                    cells.append(cell)
            lines.append(f"| {system} | " + " | ".join(cells) + " |")
        lines.append("")
    if run.startup:
        lines += [
            "## Start-up: 8 worker processes (CartPole-v1) to the first reset",
            "",
            "| system | seconds | worker USS sum (MB) | worker USS mean (MB) | |",
            "|---|---:|---:|---:|---|",
        ]
        for s in run.startup:
            lines.append(f"| {s.system} | {s.seconds:.3f} | {s.uss_sum:.1f} | {s.uss_mean:.1f} | {s.note} |")
        lines.append("")
    lines += targets(run, meta)
    if run.skipped:
        lines += ["## Left out", ""] + [f"- {s}" for s in run.skipped] + [""]
    return "\n".join(lines)


def targets(run: Run, meta: dict[str, Any]) -> list[str]:
    """The issue's targets, each with what this run measured."""
    checks: list[tuple[str, str, bool]] = []

    def ratio(workload: str, peer: str, n: int = 8) -> float | None:
        ours, theirs = find(run.rows, workload, REFERENCE, n), find(run.rows, workload, peer, n)
        if ours is None or theirs is None:
            return None
        return ours.steps_per_s / theirs.steps_per_s

    for peer, goal in (("gymnasium AsyncVectorEnv", 2.0), ("torchrl ParallelEnv", 10.0)):
        if (r := ratio("cartpole", peer)) is not None:
            checks.append(
                (f"CartPole N=8: aenvs process lockstep >= {goal:g}x {peer}", f"{r:.2f}x", r >= goal)
            )
    if (ours := find(run.rows, "cpu", REFERENCE, 8)) is not None:
        bound = meta["cpu_bound"]
        checks.append(
            (
                f"CPU-bound N=8: >= 90% of the {CPUS}-core bound ({bound:,.0f} steps/s)",
                f"{ours.steps_per_s:,.0f} = {ours.steps_per_s / bound:.0%}",
                ours.steps_per_s >= 0.9 * bound,
            )
        )
        if "cpu_bare" in meta:
            bare = meta["cpu_bare"]
            checks.append(
                (
                    f"(for reference) CPU-bound N=8 against {CPUS} bare processes ({bare:,.0f} steps/s)",
                    f"{ours.steps_per_s / bare:.0%}",
                    ours.steps_per_s >= 0.9 * bare,
                )
            )
        peers = [r for r in run.rows if r.workload == "cpu" and r.n == 8 and not r.system.startswith("aenvs")]
        if peers:
            best = max(peers, key=lambda r: r.steps_per_s)
            checks.append(
                (
                    "CPU-bound N=8: not below any peer",
                    f"best peer {best.system} {best.steps_per_s:,.0f}",
                    ours.steps_per_s >= best.steps_per_s,
                )
            )
    checks += hot_path_targets(run.rows)
    if (r := ratio("pixels", "gymnasium AsyncVectorEnv")) is not None:
        checks.append(("Large obs N=8: >= 1.5x gymnasium AsyncVectorEnv (shm)", f"{r:.2f}x", r >= 1.5))
    by_name = {s.system: s for s in run.startup}
    cold = by_name.get("aenvs process (cold zygote)")
    if cold is not None:
        checks.append(
            ("Start-up of 8 workers < 1 s (cold zygote)", f"{cold.seconds:.3f} s", cold.seconds < 1)
        )
        if (trl := by_name.get("torchrl ParallelEnv (spawn)")) is not None:
            r = trl.seconds / cold.seconds
            checks.append(("Start-up >= 10x faster than TorchRL ParallelEnv", f"{r:.0f}x", r >= 10))
        if (gym_ := by_name.get("gymnasium AsyncVectorEnv")) is not None:
            checks.append(
                (
                    "Worker USS beside gymnasium's (mean, within 10%)",
                    f"{cold.uss_mean:.1f} MB vs {gym_.uss_mean:.1f} MB",
                    cold.uss_mean <= 1.1 * gym_.uss_mean,
                )
            )
    if not checks:
        return []
    lines = ["## Targets", "", "| target | measured | holds |", "|---|---:|---|"]
    lines += [f"| {what} | {got} | {'yes' if ok else '**no**'} |" for what, got, ok in checks]
    return [*lines, ""]


def hot_path_targets(rows: list[Row]) -> list[tuple[str, str, bool]]:
    """The pool's own cost (issue #21): each target and what ``rows`` measured."""
    checks: list[tuple[str, str, bool]] = []

    def sps(workload: str, system: str, n: int) -> float | None:
        row = find(rows, workload, system, n)
        return None if row is None else row.steps_per_s

    def process(n: int) -> float | None:
        rates = [r for s in ("lockstep", "overlapped") if (r := sps("cartpole", f"aenvs process {s}", n))]
        return max(rates) if rates else None

    def check(what: str, ours: float | None, theirs: float | None, goal: float) -> None:
        if ours is not None and theirs:
            checks.append((what, f"{ours / theirs:.2f}x", ours / theirs >= goal))

    check(
        "CartPole N=8: aenvs inline lockstep >= 0.7x gymnasium SyncVectorEnv",
        sps("cartpole", "aenvs inline lockstep", 8),
        sps("cartpole", "gymnasium SyncVectorEnv", 8),
        0.7,
    )
    check("CartPole N=32: aenvs process >= 0.5x the bound", process(32), sps("cartpole", BOUND, 32), 0.5)
    async_ = "gymnasium AsyncVectorEnv"
    check(f"CartPole N=32: aenvs process >= 5x {async_}", process(32), sps("cartpole", async_, 32), 5)
    check("CartPole N=32: aenvs process >= 0.25x envpool", process(32), sps("cartpole", "envpool", 32), 0.25)
    check(f"CartPole N=8: aenvs process >= 3x {async_}", process(8), sps("cartpole", async_, 8), 3)

    def check_time(what: str, ours: float | None, theirs: float | None, at_most: float) -> None:
        """``what`` holds if aenvs's time per call is at most ``at_most`` times the peer's."""
        if ours and theirs:
            ratio = theirs / ours  # steps/s the other way round: the ratio of the times per call
            checks.append((what, f"{ratio:.2f}x the time", ratio <= at_most))

    for n in VECTOR_SIZES:
        check_time(
            f"vector API N={n}: aenvs process envs.step <= 0.5x {async_}'s",
            sps("vector", "aenvs.gymnasium process", n),
            sps("vector", async_, n),
            0.5,
        )
        check_time(
            f"vector API N={n}: aenvs inline envs.step <= 2x gymnasium SyncVectorEnv's",
            sps("vector", "aenvs.gymnasium inline", n),
            sps("vector", "gymnasium SyncVectorEnv", n),
            2,
        )
    own = find(rows, "cartpole", "aenvs inline lockstep", 32)
    if own is not None and own.own_cpu_us_per_step is not None:
        checks.append(
            (
                "CartPole N=32: aenvs inline lockstep's own CPU <= 2 us per env step",
                f"{own.own_cpu_us_per_step:.1f} us",
                own.own_cpu_us_per_step <= 2,
            )
        )
    return checks


# -- main -----------------------------------------------------------------------------------------


def versions() -> str:
    out = [f"Python {platform.python_version()}", f"aenvs {aenvs.__version__}"]
    for package in ("torch", "tensordict", "gymnasium", "numpy", "torchrl", "envpool", "uvloop"):
        try:
            out.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(out)


SECTIONS = ("cartpole", "cpu", "pixels", "vector", "startup")
VECTOR_SIZES = (4, 16)
PEERS: tuple[str, ...] = ("gymnasium", "torchrl", "envpool")


def measure_run(
    duration: float = 2.0,
    warmup: float = 0.3,
    only: Sequence[str] = SECTIONS,
    skip_peers: Sequence[str] = (),
    sizes: Sequence[int] | None = None,
    attempts: int = ATTEMPTS,
) -> tuple[Run, dict[str, Any]]:
    """Measure the sections of ``only`` (each workload at its N in ``sizes``, default all)
    against the peers not skipped, each cell up to ``attempts`` times while other jobs
    disturb it: the run and what the report says about its setting."""
    peers = set(PEERS) - set(skip_peers)
    run = Run(duration, warmup, attempts)
    begin = time.perf_counter()

    for peer, module in (("torchrl", "torchrl.envs"), ("envpool", "envpool")):
        if peer in peers:
            try:
                __import__(module)
            except Exception as exc:
                run.skipped.append(f"{peer}: does not import here ({exc!r})")
                peers.discard(peer)

    rounds, step_s = calibrate_rounds()
    with open("/proc/cpuinfo") as f:
        models = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    cpu_model = models[0] if models else platform.processor()
    meta: dict[str, Any] = {
        "machine": f"{CPUS} cores ({cpu_model})",
        "versions": versions(),
        "cpu_rounds": rounds,
        "cpu_step_ms": step_s * 1e3,
        "cpu_bound": CPUS / step_s,
        "command": " ".join(["python", *sys.argv]),
        "torch_threads": torch.get_num_threads(),
    }
    if "cpu" in only:
        meta["cpu_bare"] = bare_processes(rounds, duration, warmup)
    print(
        f"cpu env: {rounds} matmuls = {step_s * 1e3:.3f} ms a step; bound {CPUS / step_s:,.0f} steps/s; "
        f"{CPUS} bare processes: {meta.get('cpu_bare', float('nan')):,.0f} steps/s",
        flush=True,
    )

    if "startup" in only:  # first, so that the aenvs zygote is cold for its first pool
        run.startup = startup_rows(8, peers, run)
        print(f"startup done ({time.perf_counter() - begin:.0f} s)", flush=True)
    for workload, (_, workload_sizes, n_actions) in WORKLOADS.items():
        if workload not in only:
            continue
        chosen = [n for n in workload_sizes if sizes is None or n in sizes]
        run.rows += bare_rows(workload, rounds, chosen, n_actions, run)
        for n in workload_sizes:
            if sizes is not None and n not in sizes:
                continue
            run.rows += run_async(aenvs_rows(workload, rounds, n, n_actions, run))
            if "gymnasium" in peers:
                run.rows += guarded(
                    f"gymnasium ({workload}, N={n})", run, gymnasium_rows, workload, rounds, n, n_actions, run
                )
            if "envpool" in peers and workload == "cartpole":
                run.rows += guarded(f"envpool ({workload}, N={n})", run, envpool_rows, workload, n, run)
            if "torchrl" in peers:
                run.rows += torchrl_rows(workload, rounds, n, run)
            print(f"{workload} N={n} done ({time.perf_counter() - begin:.0f} s)", flush=True)
    if "vector" in only:
        chosen = [n for n in VECTOR_SIZES if sizes is None or n in sizes]
        run.rows += vector_rows(chosen, run, peers)
        print(f"vector done ({time.perf_counter() - begin:.0f} s)", flush=True)
    own_cpu(run.rows)
    meta["wall_s"] = time.perf_counter() - begin
    return run, meta


def measure(
    duration: float = 2.0,
    warmup: float = 0.3,
    only: Sequence[str] = SECTIONS,
    skip_peers: Sequence[str] = (),
    sizes: Sequence[int] | None = None,
    attempts: int = ATTEMPTS,
) -> list[Row | Startup]:
    """The rows of :func:`measure_run`, start-up rows last (``aenvs bench`` calls this)."""
    run, _ = measure_run(duration, warmup, only, skip_peers, sizes, attempts)
    for note in run.skipped:
        print(f"left out: {note}", flush=True)
    for what, got, holds in hot_path_targets(run.rows):
        print(f"target: {what}: {got} ({'holds' if holds else 'NOT MET'})", flush=True)
    return [*run.rows, *run.startup]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=2.0, help="seconds measured per cell")
    parser.add_argument("--warmup", type=float, default=0.3, help="seconds stepped before measuring")
    parser.add_argument("--only", default=",".join(SECTIONS), help="sections to run")
    parser.add_argument("--skip-peers", default="", help="peers to leave out: " + ",".join(PEERS))
    parser.add_argument(
        "--torch-threads", type=int, default=0, help="torch.set_num_threads here (default: torch's own)"
    )
    parser.add_argument("--out", default=RESULTS, help="directory for throughput.md and throughput.json")
    args = parser.parse_args()
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    run, meta = measure_run(
        args.duration, args.warmup, args.only.split(","), list(filter(None, args.skip_peers.split(",")))
    )

    report = tables(run, meta)
    print(report)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "throughput.md"), "w") as f:
        f.write(report)
    with open(os.path.join(args.out, "throughput.json"), "w") as f:
        startup = [{**asdict(s), "uss_sum_mb": s.uss_sum, "uss_mean_mb": s.uss_mean} for s in run.startup]
        json.dump(
            {**meta, **asdict(run), "startup": startup, "reference": REFERENCE}, f, indent=2, allow_nan=True
        )


if __name__ == "__main__":
    main()
