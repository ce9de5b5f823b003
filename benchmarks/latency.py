"""Latency benchmark: N envs whose step takes L = 10 ms, against the ideal N / L steps/s.

inline: a native env whose ``async def step`` awaits ``asyncio.sleep(L)``; all N in flight on the loop.
thread: a native env whose plain ``step`` blocks in ``time.sleep(L)``; one thread per env, the
threads shared by the envs (the default), and each env on its own thread (``pinned=True``).

Each pool runs the overlapped loop an async trainer runs: reset every env, send every env, then
repeatedly receive whatever finished (``async_step_recv(min_get=1)``) and re-send those envs at
once. The inline executor runs that loop twice: receiving every finished env, and at
most 16 per receive (``max_get=16``, a trainer whose policy takes batches of up to 16),
which re-sends the first envs of a cohort that finished together before the last are
gathered. Beside each, in the same run, a bare reference with no pool: N asyncio tasks that
only loop ``await asyncio.sleep(L)`` (inline), and a ``ThreadPoolExecutor(N)`` whose
``time.sleep(L)`` jobs are re-submitted as they complete (thread). The inline rows also run
both loops over a reference that does the least any pool could (``TimerPool``: one timer per
env started by the send, one TensorDict per receive): what the loop's shape itself costs on
this machine; the thread rows the same loop over ``time.sleep(L)`` jobs on a
``ThreadPoolExecutor(N)`` whose ends reach the loop with ``call_soon_threadsafe``
(``ThreadTimerPool``): what routing every step through the loop costs with threads. If
gymnasium is installed, its ``AsyncVectorEnv`` (lockstep ``step_async`` / ``step_wait``) on
a ``time.sleep(L)`` env at N=64 is a peer row.

Every row is measured for ``--duration`` seconds after a ``--warmup`` (0.5 s) warm-up. Columns printed:

- steps/s: env steps completed in the window / the window's wall-clock seconds;
- ideal N/L: every env stepping back to back, no overhead (N / 0.010);
- % of ideal: steps/s / ideal;
- CPU us/step: CPU seconds of this process (``time.process_time()``, all its threads) over the
  window / steps in the window, in microseconds. For AsyncVectorEnv, the parent process only;
- overhead us/step (pool rows only): the pool's own CPU per step, i.e. the pool row's
  CPU us/step minus the CPU us/step of its bare reference at the same N (which pays for the
  sleeps, timers and thread wake-ups themselves);
- full GCs: CPython's full collections during the window (each walks every object torch
  loaded: 0.1-0.2 s here).

``--gc-freeze`` calls ``gc.freeze()`` once everything is imported (a long-running trainer can do
the same): CPython's full collections then skip the ~300k objects torch's import leaves behind,
which they otherwise walk ~every second at N=1024.

    python benchmarks/latency.py [--duration 3] [--warmup 0.5] [--loop uvloop|asyncio] [--json PATH] [--gc-freeze]
                                 [--only inline:256 inline:1024] [--no-peer]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import contextlib
import gc
import json
import os
import platform
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np
import tensordict
import torch
import uvloop
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

import aenvs
from aenvs import AsyncEnvPool, Env
from aenvs._rows import pick_rows
from aenvs.executors import ThreadExecutor
from aenvs.executors._thread import _yield_to_the_loop as yield_to_the_loop  # pyright: ignore[reportPrivateUsage]

LATENCY = 0.010  # L: seconds per env step
WARMUP = 0.5  # seconds run before each measured window
INLINE_NS = (64, 256, 1024)
THREAD_NS = (64, 256)
PEER_N = 64
BOUNDED_GET = 16  # the inline rows' second loop: a policy batch of at most 16 envs per receive
DEFAULT_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "latency.json")

OBSERVATION = np.zeros(1, np.float32)


# -- the envs ---------------------------------------------------------------------------


class SleepyEnv(Env):
    """A plain env whose step blocks for L; it returns a plain dict (the cheap form aenvs.Env allows)."""

    observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> TensorDictBase:
        return TensorDict(observation=torch.zeros(1))

    def step(self, td: TensorDictBase) -> dict[str, Any]:  # pyright: ignore[reportIncompatibleMethodOverride]
        time.sleep(LATENCY)
        return {"observation": OBSERVATION, "reward": 0.0, "terminated": False}


class AsyncSleepyEnv(SleepyEnv):
    """The same env, awaiting instead of blocking: the inline executor runs all N concurrently."""

    async def step(self, td: TensorDictBase) -> dict[str, Any]:  # pyright: ignore[reportIncompatibleMethodOverride]
        await asyncio.sleep(LATENCY)
        return {"observation": OBSERVATION, "reward": 0.0, "terminated": False}


# -- measuring ----------------------------------------------------------------------------


@dataclass
class Row:
    system: str
    executor: str
    n: int
    steps_per_s: float
    ideal: float
    percent_of_ideal: float
    cpu_us_per_step: float
    full_gcs: int = 0  # CPython full (generation 2) collections during the window
    overhead_us: float | None = None  # pool rows: cpu_us_per_step minus the bare reference's


_full_gcs = 0  # full collections in the last Window.measure()


def make_row(system: str, executor: str, n: int, steps: int, wall: float, cpu: float) -> Row:
    rate, ideal = steps / wall, n / LATENCY
    return Row(system, executor, n, rate, ideal, 100 * rate / ideal, 1e6 * cpu / max(steps, 1), _full_gcs)


@dataclass(frozen=True)
class Window:
    """How long a row runs: ``warmup`` seconds unmeasured, then ``duration`` seconds measured."""

    duration: float
    warmup: float = WARMUP

    async def measure(self, advance: Callable[[], Awaitable[int]]) -> tuple[int, float, float]:
        """Call ``advance`` (it returns the steps it saw) through the warm-up, then for
        ``duration`` seconds: (steps, wall seconds, CPU seconds) of the measured part."""
        global _full_gcs
        deadline = time.perf_counter() + self.warmup
        while time.perf_counter() < deadline:
            await advance()
        steps = 0
        full0 = gc.get_stats()[2]["collections"]
        cpu0, t0 = time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < self.duration:
            steps += await advance()
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        _full_gcs = gc.get_stats()[2]["collections"] - full0
        return steps, wall, cpu


async def pool_row(
    executor: str, n: int, window: Window, max_get: int | None = None, pinned: bool = False
) -> Row:
    """The overlapped loop: receive what finished (at most ``max_get``), re-send those envs at
    once. ``pinned``: the thread executor with each env on its own thread throughout."""
    env_fn = AsyncSleepyEnv if executor == "inline" else SleepyEnv
    chosen: str | ThreadExecutor = ThreadExecutor(pinned=True) if pinned else executor
    async with AsyncEnvPool([env_fn] * n, executor=chosen) as pool:
        td = await pool.reset()
        td["action"] = torch.zeros(n, dtype=torch.int64)
        await pool.async_step_send(td)

        async def advance() -> int:
            out = await pool.async_step_recv(min_get=1, max_get=max_get)
            await pool.async_step_send(out.select("action", "env_index"))
            return out.batch_size[0]

        steps, wall, cpu = await window.measure(advance)
        await pool.async_step_recv(min_get=n)  # the steps still in flight, before closing
    system = f"aenvs {executor}" + (f", max_get={max_get}" if max_get is not None else "")
    system += ", pinned" if pinned else ""
    return make_row(system, executor, n, steps, wall, cpu)


class TimerPool:
    """The least a pool can do in the overlapped loop, as a reference row: the send starts one
    L-second timer per env (what the env's ``asyncio.sleep`` starts); its expiry writes the
    env's step result into numpy rows and marks the env ready; the receive hands the ready envs
    over as one TensorDict in the pool's layout (action, "next" and "env_index", sorted by env).
    No env objects, tasks, checks or bookkeeping: what it loses against the ideal is the
    loop's own shape (one receive per batch, then one re-send) on this machine's timers.

    Example:
        >>> pool = TimerPool(4)  # inside a running loop
        >>> pool.send(TensorDict(action=torch.zeros(4, dtype=torch.int64), env_index=torch.arange(4), batch_size=[4]))
        >>> out = await pool.recv(max_get=None)
    """

    def __init__(self, n: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._action = np.zeros(n, np.int64)
        self._next = {
            "observation": np.zeros((n, 1), np.float32),
            "reward": np.zeros((n, 1), np.float32),
            "terminated": np.zeros((n, 1), bool),
            "truncated": np.zeros((n, 1), bool),
            "done": np.zeros((n, 1), bool),
        }
        self._ready: list[int] = []
        self._arrived = asyncio.Event()
        self.in_flight = 0

    def _finish(self, i: int) -> None:
        step = {"observation": OBSERVATION, "reward": 0.0, "terminated": False}  # AsyncSleepyEnv's
        nxt = self._next
        nxt["observation"][i] = step["observation"]
        nxt["reward"][i] = step["reward"]
        nxt["terminated"][i] = nxt["done"][i] = step["terminated"]
        nxt["truncated"][i] = False
        self._ready.append(i)
        self._arrived.set()

    async def recv(self, max_get: int | None) -> TensorDict:
        while not self._ready:
            self._arrived.clear()
            await self._arrived.wait()
        take = len(self._ready) if max_get is None else max_get
        ready, self._ready = sorted(self._ready[:take]), self._ready[take:]
        self.in_flight -= len(ready)
        rows = np.array(ready)
        # rows picked as the pool picks them, holding the GIL (numpy's take lets go of it,
        # which waiting threads then hold while the loop waits: docs/performance.md)
        nxt = {key: torch.from_numpy(pick_rows(values, rows)) for key, values in self._next.items()}
        return TensorDict(
            action=torch.from_numpy(pick_rows(self._action, rows)),
            next=TensorDict(nxt, batch_size=[len(ready)]),
            env_index=torch.from_numpy(rows),
            batch_size=[len(ready)],
        )

    def send(self, td: TensorDictBase) -> None:
        indices = td["env_index"].tolist()
        self._action[indices] = cast(torch.Tensor, td["action"]).numpy()
        self.in_flight += len(indices)
        for i in indices:
            self._start(i)

    def _start(self, i: int) -> None:
        self._loop.call_later(LATENCY, self._finish, i)


class ThreadTimerPool(TimerPool):
    """:class:`TimerPool` whose waits are ``time.sleep(L)`` jobs on ``threads`` (a
    ``ThreadPoolExecutor(N)``), each job's end handed to the loop with
    ``call_soon_threadsafe``, as the thread executor hands over an env's step: what routing
    every step through the event loop costs with threads, with no pool. The bare
    ``ThreadPoolExecutor`` row re-submits each job from its worker thread instead, which a
    trainer cannot do: the next action comes from the loop."""

    def __init__(self, n: int, threads: concurrent.futures.ThreadPoolExecutor) -> None:
        super().__init__(n)
        self._threads = threads
        self._ended: collections.deque[int] = collections.deque()
        self._wake_pending = False  # one call_soon_threadsafe per burst of ends, as the executor

    def _start(self, i: int) -> None:
        self._threads.submit(time.sleep, LATENCY).add_done_callback(lambda _: self._end(i))

    def _end(self, i: int) -> None:
        self._ended.append(i)
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._hand_over)
            except RuntimeError:  # the loop closed
                pass

    def _hand_over(self) -> None:
        self._wake_pending = False
        ended = self._ended
        while ended:
            self._finish(ended.popleft())


async def reference_row(n: int, window: Window, max_get: int | None = None, threads: bool = False) -> Row:
    """The overlapped loop of ``pool_row`` over a :class:`TimerPool` (``threads``: a
    :class:`ThreadTimerPool`)."""
    # the threads under the thread executor's scheduling policy (SCHED_BATCH where Linux has it)
    executor = concurrent.futures.ThreadPoolExecutor(n, initializer=yield_to_the_loop) if threads else None
    with executor or contextlib.nullcontext():
        pool = TimerPool(n) if executor is None else ThreadTimerPool(n, executor)
        pool.send(
            TensorDict(action=torch.zeros(n, dtype=torch.int64), env_index=torch.arange(n), batch_size=[n])
        )

        async def advance() -> int:
            out = await pool.recv(max_get)
            pool.send(out.select("action", "env_index"))
            return out.batch_size[0]

        steps, wall, cpu = await window.measure(advance)
        while pool.in_flight:  # no timer (or job) of this row ends in the next one
            await pool.recv(None)
    kind = "threads, loop" if threads else "timers"
    system = f"reference: {kind}, no pool" + (f", max_get={max_get}" if max_get is not None else "")
    return make_row(system, "thread" if threads else "inline", n, steps, wall, cpu)


async def bare_tasks_row(n: int, window: Window) -> Row:
    """N asyncio tasks that only sleep L in a loop: what the event loop itself allows."""
    done = 0

    async def sleeper() -> None:
        nonlocal done
        while True:
            await asyncio.sleep(LATENCY)
            done += 1

    async def advance() -> int:
        before = done
        await asyncio.sleep(0.05)
        return done - before

    tasks = [asyncio.create_task(sleeper()) for _ in range(n)]
    steps, wall, cpu = await window.measure(advance)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return make_row("bare asyncio tasks", "inline", n, steps, wall, cpu)


async def bare_threads_row(n: int, window: Window) -> Row:
    """A ThreadPoolExecutor(N) running time.sleep(L) jobs, each re-submitted from its worker
    thread as it completes (no event loop involved): what N threads themselves allow."""
    done = 0
    lock, stop = threading.Lock(), threading.Event()
    with concurrent.futures.ThreadPoolExecutor(n) as threads:

        def resubmit(_: concurrent.futures.Future[None]) -> None:
            nonlocal done
            with lock:
                done += 1
            if not stop.is_set():
                threads.submit(time.sleep, LATENCY).add_done_callback(resubmit)

        async def advance() -> int:
            before = done
            await asyncio.sleep(0.05)
            return done - before

        for _ in range(n):
            threads.submit(time.sleep, LATENCY).add_done_callback(resubmit)

        steps, wall, cpu = await window.measure(advance)
        stop.set()
    return make_row("bare ThreadPoolExecutor", "thread", n, steps, wall, cpu)


def gymnasium_row(n: int, window: Window) -> Row | None:
    """gymnasium's AsyncVectorEnv (lockstep: every step waits for the slowest env) on a
    time.sleep(L) env, as a peer; None, with a note, where it cannot run."""
    try:
        import gymnasium as gym

        class GymSleepyEnv(gym.Env):
            observation_space = spaces.Box(-1, 1, (1,), np.float32)
            action_space = spaces.Discrete(2)

            def reset(
                self, *, seed: int | None = None, options: dict[str, Any] | None = None
            ) -> tuple[np.ndarray, dict[str, Any]]:
                super().reset(seed=seed)
                return np.zeros(1, np.float32), {}

            def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
                time.sleep(LATENCY)
                return np.zeros(1, np.float32), 0.0, False, False, {}

        envs = gym.vector.AsyncVectorEnv([GymSleepyEnv] * n, context="fork")
    except Exception as exc:  # an optional peer: report it and go on
        print(f"gymnasium AsyncVectorEnv skipped: {exc!r}")
        return None
    try:
        envs.reset(seed=0)
        actions = np.zeros(n, np.int64)
        deadline = time.perf_counter() + window.warmup
        while time.perf_counter() < deadline:
            envs.step(actions)
        steps = 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        while time.perf_counter() - t0 < window.duration:
            envs.step_async(actions)
            envs.step_wait()
            steps += n
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    except Exception as exc:
        print(f"gymnasium AsyncVectorEnv failed: {exc!r}")
        return None
    finally:
        envs.close()
    return make_row("gymnasium AsyncVectorEnv", "process", n, steps, wall, cpu)


async def run(window: Window, only: set[str] | None = None) -> list[Row]:
    """Each pool row right after its bare reference at the same N (its overhead is relative to it);
    ``only``: the rows to run, as ``executor:N``."""
    rows: list[Row] = []
    plan = [("inline", n, bare_tasks_row) for n in INLINE_NS]
    plan += [("thread", n, bare_threads_row) for n in THREAD_NS]
    if only is not None:
        plan = [(executor, n, bare_row) for executor, n, bare_row in plan if f"{executor}:{n}" in only]
    for executor, n, bare_row in plan:
        bare = await bare_row(n, window)
        pools = [await pool_row(executor, n, window)]
        references = []
        if executor == "thread":
            pools.append(await pool_row(executor, n, window, pinned=True))
            references = [await reference_row(n, window, threads=True)]
        if executor == "inline":
            pools.append(await pool_row(executor, n, window, BOUNDED_GET))
            references = [await reference_row(n, window), await reference_row(n, window, BOUNDED_GET)]
        for pool in pools:
            pool.overhead_us = pool.cpu_us_per_step - bare.cpu_us_per_step
        rows += [*pools, *references, bare]
        print(f"  done: {executor} N={n}", flush=True)
    return rows


def measure(
    duration: float = 3.0,
    loop: str = "uvloop",
    only: set[str] | None = None,
    peer: bool = True,
    warmup: float = WARMUP,
) -> list[Row]:
    """The rows of the benchmark: the pools beside their bare references (``only``: the rows
    ``executor:N`` to run), then gymnasium's unless ``peer`` is false or ``only`` is given
    (``aenvs bench`` calls this; ``main`` prints and saves it). Each row runs ``warmup``
    seconds, then is measured for ``duration`` seconds."""
    loop_factory = uvloop.new_event_loop if loop == "uvloop" else asyncio.new_event_loop
    window = Window(duration, warmup)
    print(f"L = {LATENCY * 1e3:.0f} ms, loop: {loop}, {duration:g} s per row", flush=True)
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        rows = runner.run(run(window, only))
    peer_row = gymnasium_row(PEER_N, window) if peer and only is None else None
    if peer_row is not None:
        rows.append(peer_row)
    return rows


# -- reporting ----------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    lines = [
        "| system | executor | N | steps/s | ideal N/L | % of ideal | CPU us/step | overhead us/step | full GCs |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        overhead = "" if r.overhead_us is None else f"{r.overhead_us:.1f}"
        lines.append(
            f"| {r.system} | {r.executor} | {r.n} | {r.steps_per_s:,.0f} | {r.ideal:,.0f} "
            f"| {r.percent_of_ideal:.1f}% | {r.cpu_us_per_step:.1f} | {overhead} | {r.full_gcs} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per row")
    parser.add_argument("--warmup", type=float, default=WARMUP, help="unmeasured seconds before each row")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="event loop")
    parser.add_argument("--json", default=DEFAULT_JSON, help="where to write the results")
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() before measuring")
    parser.add_argument(
        "--only", nargs="+", metavar="EXECUTOR:N", help="run only these rows, e.g. inline:256 inline:1024"
    )
    parser.add_argument("--no-peer", action="store_true", help="leave gymnasium's AsyncVectorEnv out")
    args = parser.parse_args()

    if args.gc_freeze:
        gc.collect()
        gc.freeze()
    only = set(args.only) if args.only else None
    rows = measure(args.duration, args.loop, only, not args.no_peer, args.warmup)

    setup = {
        "command": " ".join(["python", *sys.argv]),
        "latency_s": LATENCY,
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "loop": args.loop,
        "gc_freeze": args.gc_freeze,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "aenvs": aenvs.__version__,
        "torch": torch.__version__,
        "tensordict": tensordict.__version__,
        "uvloop": uvloop.__version__,
    }
    print(", ".join(f"{k}={v}" for k, v in setup.items()))
    print(table(rows))
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({**setup, "rows": [asdict(r) for r in rows]}, f, indent=2)
        f.write("\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
