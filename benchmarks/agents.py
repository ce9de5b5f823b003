"""Agent envs: N slow, long-tailed text envs and a batched policy server, under six loop shapes.

The workload (one process, the machine's cores):

- N coroutine envs (``--num-envs``, default 256, 1,024 and 4,096) whose step latency is
  lognormal, median 50 ms and p99 about 2 s (``sigma`` = ln(40) / 2.326, so the mean is
  50 ms x exp(sigma^2 / 2), about 176 ms). Each env draws its latencies from its own
  generator seeded by its index, so every loop shape sees the same sequence of latencies
  per env. An observation is a text of 500-2,000 characters, an action a short text, an
  episode lasts 3-20 turns (uniform); a reset costs no latency.
- A policy stand-in, an inference server: a call on a batch of B observations costs
  ``5 ms + 0.05 ms x B`` (``asyncio.sleep``), at most 2 calls at once (a semaphore).

The loop shapes (``--shapes``), each on the same envs and the same server:

- ``lockstep``: step every env, wait for all, one policy call on the N observations, repeat
  (gymnasium's vector envs, TorchRL's ParallelEnv);
- ``per-request``: a task per episode, one policy call (batch 1) per turn (verl's agent loop);
- ``flush``: a task per episode, requests batched by a batcher that flushes at 64 requests
  or 2 ms after the first one;
- ``threads``: a task per episode whose env steps block on a 256-thread pool (SkyRL), the
  policy batched as the ``slot`` shape does (the continuous batching of an inference engine);
- ``slot``: a task per episode, requests batched when a server slot frees: each of two
  dispatchers takes every request pending when its previous call returns;
- ``aenvs``: ``aenvs.AsyncEnvPool(executor="inline")`` of the same envs (a gymnasium env whose
  ``step`` is an ``async def``), a hand-written overlapped loop: two receivers, each
  ``async_step_and_maybe_reset_recv`` (``min_get``), one policy call on what it got,
  ``async_step_and_maybe_reset_send`` (ended episodes reset in the same round trip);
- ``collect``: ``aenvs.collect`` over that pool, the server as its async policy, two policy
  calls at once (each whole episode handed out as an ``Episode``);
- ``server``: the envs behind ``aenvs.serve`` (the external-env server), run by
  ``CLIENT_PROCESSES`` client processes over loopback websockets, ``aenvs.collect`` over the
  server's pool; at the smallest N only (256 by default).

The bounds. The envs allow ``N / 176 ms`` steps/s (every env always stepping); the server
allows ``2 x B / (5 ms + 0.05 ms x B)`` at batch B, at most 40,000/s. ``bound`` is the
smaller of the envs' and the server's at the largest batch a loop could form (N in flight):
the workload's bound, the same for every shape, and ``share`` is steps/s over it.
``shape_bound`` puts the largest batch the shape forms in B (lockstep: N, with one call
at a time; per-request: 1; flush: 64; the others: N) and ``shape_share`` is steps/s over
it: how far the shape falls short of what its own batching allows.

Measured per row: env steps completed (counted as each env's step returns) over
``--repeats`` consecutive windows of ``--seconds`` after ``--warmup`` seconds; the medians
of steps/s and of CPU per step of the thread that runs the event loop (``time.thread_time``:
the loop, the batching and, for aenvs, the pool and the envs' coroutines; the ``threads``
shape's env steps run on other threads, counted in the process CPU per step, also
reported). Also per row: the mean latency the envs drew and the policy's mean batch size.
Results go to ``benchmarks/results/agents.json``.

Run (a few minutes; ``--quick`` checks the script in seconds):
    python benchmarks/agents.py --num-envs 256 1024 4096 --seconds 6 --repeats 3
    python benchmarks/agents.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import gc
import json
import math
import os
import platform
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import tensordict
import torch
from gymnasium import spaces
from tensordict import TensorDictBase

import aenvs
from aenvs import AsyncEnvPool, EnvContext
from aenvs._tensors import non_tensor_stack, non_tensor_values, td_get

MEDIAN_LATENCY = 0.050
P99_LATENCY = 2.0
SIGMA = math.log(P99_LATENCY / MEDIAN_LATENCY) / 2.3263478740408408  # z of the 99th percentile
MEAN_LATENCY = MEDIAN_LATENCY * math.exp(SIGMA**2 / 2)
OBS_CHARS = (500, 2000)
TURNS = (3, 20)
CALL_COST = 0.005  # seconds per policy call
ITEM_COST = 0.00005  # seconds per observation in a call
SERVER_SLOTS = 2
FLUSH_SIZE, FLUSH_WAIT = 64, 0.002
THREADS = 256
SHAPES = ("lockstep", "per-request", "flush", "threads", "slot", "aenvs", "collect", "server")
CLIENT_PROCESSES = 4
SCRIPT = os.path.abspath(__file__)  # what the server row's client processes run
CHARSET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,"
ACTIONS = ("look", "go north", "take lamp", "open door")
PAGES = tuple("".join(CHARSET[(i * 7 + k) % len(CHARSET)] for k in range(OBS_CHARS[1])) for i in range(8))
DEFAULT_JSON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "agents.json")


# -- the envs ------------------------------------------------------------------------------


class Tally:
    """What the envs of one row did: steps completed and latencies drawn."""

    def __init__(self) -> None:
        self.steps = 0
        self.draws = 0
        self.drawn = 0.0  # seconds, summed
        self.lock = threading.Lock()  # the thread-pool shape's envs count from many threads


class TextAgent:
    """The plain-python env: text in, text out, a seeded lognormal latency per step.

    ``step`` awaits its latency, ``step_blocking`` sleeps it (cut short by ``stop``);
    the same draws in the same order either way.
    """

    def __init__(self, index: int, tally: Tally) -> None:
        self.rng = np.random.default_rng(index)
        self.tally = tally
        self.turn, self.turns = 0, 0

    def reset(self) -> str:
        self.turn, self.turns = 0, int(self.rng.integers(TURNS[0], TURNS[1] + 1))
        return self._text()

    def _text(self) -> str:
        length = int(self.rng.integers(OBS_CHARS[0], OBS_CHARS[1] + 1))
        return PAGES[self.turn % len(PAGES)][:length]

    def _latency(self) -> float:
        latency = MEDIAN_LATENCY * math.exp(SIGMA * float(self.rng.standard_normal()))
        self.tally.draws += 1
        self.tally.drawn += latency
        return latency

    def _advance(self, action: str) -> tuple[str, float, bool]:
        self.turn += 1
        return self._text(), float(len(action)), self.turn >= self.turns

    async def step(self, action: str) -> tuple[str, float, bool]:
        await asyncio.sleep(self._latency())
        self.tally.steps += 1
        return self._advance(action)

    def step_blocking(self, action: str, stop: threading.Event) -> tuple[str, float, bool]:
        with self.tally.lock:
            latency = self._latency()
        stop.wait(latency)
        with self.tally.lock:
            self.tally.steps += 1
            return self._advance(action)


OBSERVATION_SPACE = spaces.Text(OBS_CHARS[1], min_length=0, charset=CHARSET)
ACTION_SPACE = spaces.Text(16, charset=CHARSET)


class TextAgentEnv(gym.Env[str, str]):
    """:class:`TextAgent` as a gymnasium env with an ``async def step`` (how an LLM tool env is
    written: the action a string in, the observation a string out)."""

    observation_space = OBSERVATION_SPACE
    action_space = ACTION_SPACE

    def __init__(self, index: int, tally: Tally) -> None:
        self.agent = TextAgent(index, tally)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        return self.agent.reset(), {}

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:  # pyright: ignore[reportIncompatibleMethodOverride]
        text, reward, ended = await self.agent.step(action)
        return text, reward, ended, False, {}


# -- the policy ------------------------------------------------------------------------------


class InferenceServer:
    """A call on a batch of B observations costs ``5 ms + 0.05 ms x B``; at most 2 at once."""

    def __init__(self) -> None:
        self.slots = asyncio.Semaphore(SERVER_SLOTS)
        self.calls = 0
        self.items = 0

    async def __call__(self, observations: Sequence[str]) -> list[str]:
        async with self.slots:
            await asyncio.sleep(CALL_COST + ITEM_COST * len(observations))
        self.calls += 1
        self.items += len(observations)
        return [ACTIONS[len(text) % len(ACTIONS)] for text in observations]


def policy_rate(batch: int, slots: int = SERVER_SLOTS) -> float:
    """Steps/s the server allows at ``batch`` observations a call, ``slots`` calls at once."""
    return slots * batch / (CALL_COST + ITEM_COST * batch)


class FlushBatcher:
    """One request at a time in, batches out: flushed at ``size`` requests or ``wait`` seconds
    after the first request of a batch, each flushed batch a server call of its own."""

    def __init__(self, server: InferenceServer, size: int = FLUSH_SIZE, wait: float = FLUSH_WAIT) -> None:
        self.server, self.size, self.wait = server, size, wait
        self.pending: list[tuple[str, asyncio.Future[str]]] = []
        self.timer: asyncio.TimerHandle | None = None
        self.calls: set[asyncio.Task[None]] = set()

    async def __call__(self, observation: str) -> str:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((observation, future))
        if len(self.pending) >= self.size:
            self.flush()
        elif self.timer is None:
            self.timer = asyncio.get_running_loop().call_later(self.wait, self.flush)
        return await future

    def flush(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.pending = self.pending, []
        task = asyncio.get_running_loop().create_task(self._call(batch))
        self.calls.add(task)
        task.add_done_callback(self.calls.discard)

    async def _call(self, batch: list[tuple[str, asyncio.Future[str]]]) -> None:
        actions = await self.server([text for text, _ in batch])
        for (_, future), action in zip(batch, actions, strict=True):
            if not future.done():
                future.set_result(action)


class SlotBatcher:
    """One request at a time in; each of ``slots`` dispatchers takes every pending request
    when its previous server call returns (call :meth:`serve` in a task)."""

    def __init__(self, server: InferenceServer, slots: int = SERVER_SLOTS) -> None:
        self.server, self.slots = server, slots
        self.pending: list[tuple[str, asyncio.Future[str]]] = []
        self.ready = asyncio.Event()

    async def __call__(self, observation: str) -> str:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((observation, future))
        self.ready.set()
        return await future

    async def serve(self) -> None:
        async with asyncio.TaskGroup() as group:
            for _ in range(self.slots):
                group.create_task(self._dispatch())

    async def _dispatch(self) -> None:
        while True:
            await self.ready.wait()
            batch, self.pending = self.pending, []
            self.ready.clear()
            if not batch:
                continue
            actions = await self.server([text for text, _ in batch])
            for (_, future), action in zip(batch, actions, strict=True):
                if not future.done():
                    future.set_result(action)


# -- the loop shapes ------------------------------------------------------------------------------

Policy = Callable[[str], Awaitable[str]]


async def lockstep(n: int, tally: Tally, server: InferenceServer) -> None:
    """Step every env, wait for all, one policy call on all N; ended episodes reset."""
    agents = [TextAgent(i, tally) for i in range(n)]
    observations = [agent.reset() for agent in agents]
    while True:
        actions = await server(observations)
        results = await asyncio.gather(*(a.step(x) for a, x in zip(agents, actions, strict=True)))
        observations = [
            agent.reset() if ended else text for agent, (text, _, ended) in zip(agents, results, strict=True)
        ]


async def _episode(agent: TextAgent, policy: Policy) -> None:
    text, ended = agent.reset(), False
    while not ended:
        text, _, ended = await agent.step(await policy(text))


async def _episodes(n: int, tally: Tally, policy: Policy, *servers: Coroutine[Any, Any, None]) -> None:
    """A task per episode for each of ``n`` envs, episodes back to back, beside ``servers``."""

    async def env_loop(agent: TextAgent) -> None:
        while True:
            await asyncio.create_task(_episode(agent, policy))

    async with asyncio.TaskGroup() as group:
        for server in servers:
            group.create_task(server)
        for i in range(n):
            group.create_task(env_loop(TextAgent(i, tally)))


async def per_request(n: int, tally: Tally, server: InferenceServer) -> None:
    """A task per episode, one policy call of batch 1 per turn."""

    async def policy(text: str) -> str:
        return (await server([text]))[0]

    await _episodes(n, tally, policy)


async def flush(n: int, tally: Tally, server: InferenceServer) -> None:
    """A task per episode, the policy behind a :class:`FlushBatcher`."""
    await _episodes(n, tally, FlushBatcher(server))


async def slot(n: int, tally: Tally, server: InferenceServer) -> None:
    """A task per episode, the policy behind a :class:`SlotBatcher`."""
    batcher = SlotBatcher(server)
    await _episodes(n, tally, batcher, batcher.serve())


async def threads(n: int, tally: Tally, server: InferenceServer) -> None:
    """A task per episode, its env steps blocking on a pool of 256 threads, the policy behind a
    :class:`SlotBatcher`."""
    batcher = SlotBatcher(server)
    stop = threading.Event()
    pool = concurrent.futures.ThreadPoolExecutor(THREADS)
    loop = asyncio.get_running_loop()

    async def episode(agent: TextAgent) -> None:
        text, ended = agent.reset(), False
        while not ended:
            action = await batcher(text)
            text, _, ended = await loop.run_in_executor(pool, agent.step_blocking, action, stop)

    async def env_loop(agent: TextAgent) -> None:
        while True:
            await asyncio.create_task(episode(agent))

    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(batcher.serve())
            for i in range(n):
                group.create_task(env_loop(TextAgent(i, tally)))
    finally:
        stop.set()
        pool.shutdown(wait=False, cancel_futures=True)


def aenvs_shape(min_get: int | None) -> Callable[[int, Tally, InferenceServer], Awaitable[None]]:
    """The aenvs row: ``min_get`` per receive (None: N // 256, at least 1)."""

    async def run(n: int, tally: Tally, server: InferenceServer) -> None:
        def make(ctx: EnvContext) -> TextAgentEnv:
            return TextAgentEnv(ctx.env_index, tally)

        least = min_get or max(1, n // 256)
        async with AsyncEnvPool([make] * n, executor="inline") as pool:
            td = await pool.reset()
            td.set("action", non_tensor_stack(await server(non_tensor_values(td_get(td, "observation")))))
            await pool.async_step_and_maybe_reset_send(td)

            async def receiver() -> None:
                while True:
                    _, td = await pool.async_step_and_maybe_reset_recv(min_get=least)
                    actions = await server(non_tensor_values(td_get(td, "observation")))
                    td.set("action", non_tensor_stack(actions))
                    await pool.async_step_and_maybe_reset_send(td)

            async with asyncio.TaskGroup() as group:
                for _ in range(SERVER_SLOTS):
                    group.create_task(receiver())

    return run


async def collect(n: int, tally: Tally, server: InferenceServer) -> None:
    """The collector: ``aenvs.collect`` over the same envs, the server as its async policy."""

    def make(ctx: EnvContext) -> TextAgentEnv:
        return TextAgentEnv(ctx.env_index, tally)

    async def policy(td: TensorDictBase) -> list[str]:
        return await server(non_tensor_values(td_get(td, "observation")))

    async with AsyncEnvPool([make] * n, executor="inline") as pool:
        async for _ in aenvs.collect(pool, policy, max_policy_calls=SERVER_SLOTS):
            pass


class CollectorTally(Tally):
    """A tally whose steps are the collector's (the envs run in other processes)."""

    def __init__(self) -> None:
        super().__init__()
        self.collector: aenvs.Collector[Any] | None = None

    @property  # pyright: ignore[reportIncompatibleVariableOverride]
    def steps(self) -> int:
        return 0 if self.collector is None else self.collector.steps

    @steps.setter
    def steps(self, value: int) -> None:
        pass


async def served(n: int, tally: Tally, server: InferenceServer) -> None:
    """The external-env server: ``n`` slots, the envs in client processes over loopback
    (``CLIENT_PROCESSES`` of them, ``n / CLIENT_PROCESSES`` episodes at once each), the
    collector over the server's pool."""
    assert isinstance(tally, CollectorTally)

    async def policy(td: TensorDictBase) -> list[str]:
        return await server(non_tensor_values(td_get(td, "observation")))

    async with aenvs.serve(n, OBSERVATION_SPACE, ACTION_SPACE) as env_server:
        clients = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                SCRIPT,
                "--client",
                env_server.url,
                "--concurrent",
                str(n // CLIENT_PROCESSES),
                "--seed",
                str(k),
            )
            for k in range(CLIENT_PROCESSES)
        ]
        try:
            async with env_server.pool() as pool:
                tally.collector = collector = aenvs.collect(pool, policy, max_policy_calls=SERVER_SLOTS)
                async for _ in collector:
                    pass
        finally:
            for process in clients:
                if process.returncode is None:
                    process.kill()
                await process.wait()


async def run_clients(url: str, concurrent: int, seed: int) -> None:
    """A client process: ``concurrent`` simulated text agents, episodes back to back, each
    step's latency slept here before the next ``get_action`` (a simulator the trainer does
    not start)."""
    tally = Tally()
    async with aenvs.AsyncPolicyClient(
        url, observation_space=OBSERVATION_SPACE, action_space=ACTION_SPACE
    ) as client:

        async def agent(k: int) -> None:
            sim = TextAgent(seed * 100_000 + k, tally)
            while True:
                episode = await client.start_episode()
                text, ended, reward = sim.reset(), False, 0.0
                while True:
                    action = await client.get_action(episode, text)
                    text, reward, ended = await sim.step(action)
                    await client.log_returns(episode, reward)
                    if ended:
                        await client.end_episode(episode, text)
                        break

        with contextlib.suppress(aenvs.PolicyServerError, OSError):
            async with asyncio.TaskGroup() as group:
                for k in range(concurrent):
                    group.create_task(agent(k))


# -- measuring ------------------------------------------------------------------------------


@dataclass
class Row:
    shape: str
    n: int
    steps_per_s: float
    bound: float  # min(N / mean latency, the server at batch N)
    share: float  # steps_per_s / bound
    shape_bound: float  # min(N / mean latency, the server at the shape's largest batch)
    shape_share: float
    cpu_us_per_step: float  # the event loop's thread
    process_cpu_us_per_step: float  # every thread of the process
    mean_latency_ms: float  # what the envs drew during the row
    draws: int  # latencies the envs drew during the row
    mean_batch: float  # observations per policy call
    windows: int


def bounds(shape: str, n: int) -> tuple[float, float]:
    """(the workload's bound, the shape's bound) in steps/s at N = ``n``."""
    envs = n / MEAN_LATENCY
    largest = {"lockstep": n, "per-request": 1, "flush": min(n, FLUSH_SIZE)}.get(shape, n)
    slots = 1 if shape == "lockstep" else SERVER_SLOTS
    return min(envs, policy_rate(n)), min(envs, policy_rate(largest, slots))


async def measure_row(
    shape: str,
    run: Callable[[int, Tally, InferenceServer], Awaitable[None]],
    n: int,
    warmup: float,
    seconds: float,
    repeats: int,
    gc_freeze: bool = False,
) -> Row:
    tally, server = (CollectorTally() if shape == "server" else Tally()), InferenceServer()
    task = asyncio.ensure_future(run(n, tally, server))
    if shape == "server":  # its client processes start first (a few seconds): the warm-up counts from then
        async with asyncio.timeout(120):
            while tally.steps == 0 and not task.done():  # noqa: ASYNC110 - a count, polled
                await asyncio.sleep(0.1)
    await asyncio.sleep(warmup)
    if gc_freeze:  # what a long-running trainer can do once everything is built
        gc.freeze()
    rates: list[float] = []
    cpus: list[float] = []
    process_cpus: list[float] = []
    calls, items = server.calls, server.items
    for _ in range(repeats):
        if task.done():
            task.result()  # a shape ended: raise what ended it
        steps0, wall0, cpu0, proc0 = tally.steps, time.perf_counter(), time.thread_time(), time.process_time()
        await asyncio.sleep(seconds)
        steps = tally.steps - steps0
        wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
        proc = time.process_time() - proc0
        rates.append(steps / wall)
        cpus.append(1e6 * cpu / max(steps, 1))
        process_cpus.append(1e6 * proc / max(steps, 1))
    calls, items = server.calls - calls, server.items - items
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if gc_freeze:
        gc.unfreeze()
    bound, shape_bound = bounds(shape, n)
    rate = statistics.median(rates)
    return Row(
        shape,
        n,
        rate,
        bound,
        rate / bound,
        shape_bound,
        rate / shape_bound,
        statistics.median(cpus),
        statistics.median(process_cpus),
        1e3 * tally.drawn / max(tally.draws, 1),
        tally.draws,
        items / max(calls, 1),
        repeats,
    )


def measure(
    num_envs: Sequence[int] = (256, 1024, 4096),
    shapes: Sequence[str] = SHAPES,
    seconds: float = 6.0,
    repeats: int = 3,
    warmup: float = 10.0,
    min_get: int | None = None,
    loop: str = "uvloop",
    gc_freeze: bool = False,
) -> list[Row]:
    """Every (N, shape) row, each in a fresh event loop."""
    runs: dict[str, Callable[[int, Tally, InferenceServer], Awaitable[None]]] = {
        "lockstep": lockstep,
        "per-request": per_request,
        "flush": flush,
        "threads": threads,
        "slot": slot,
        "aenvs": aenvs_shape(min_get),
        "collect": collect,
        "server": served,
    }
    torch.set_num_threads(1)
    rows: list[Row] = []
    for n in num_envs:
        for shape in shapes:
            if shape == "server" and n != min(num_envs):
                continue  # its clients are processes: one N (the smallest, 256 by default)
            main = measure_row(shape, runs[shape], n, warmup, seconds, repeats, gc_freeze)
            if loop == "uvloop":
                import uvloop

                row = uvloop.run(main)
            else:
                row = asyncio.run(main)
            rows.append(row)
            print(
                f"{shape:12s} N={n:5d} {row.steps_per_s:9,.0f} steps/s  {100 * row.share:5.1f}% of "
                f"{row.bound:7,.0f}  ({100 * row.shape_share:5.1f}% of the shape's {row.shape_bound:7,.0f})  "
                f"{row.cpu_us_per_step:7.1f} us CPU/step (process {row.process_cpu_us_per_step:7.1f})  "
                f"latency {row.mean_latency_ms:5.1f} ms  batch {row.mean_batch:6.1f}",
                flush=True,
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--seconds", type=float, default=6.0, help="seconds per measured window")
    parser.add_argument("--repeats", type=int, default=3, help="measured windows per row (median)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds run before the first window")
    parser.add_argument("--min-get", type=int, default=None, help="aenvs receives (default N // 256)")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop")
    parser.add_argument("--quick", action="store_true", help="N = 64, 1 s windows: checks the script")
    parser.add_argument(
        "--gc-freeze", action="store_true", help="gc.freeze() once each row's envs are built (every shape)"
    )
    parser.add_argument("--json", default=DEFAULT_JSON, help="where to write the results")
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)  # run as a client process
    parser.add_argument("--concurrent", type=int, default=64, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        import uvloop

        uvloop.run(run_clients(args.client, args.concurrent, args.seed))
        return
    if args.quick:
        args.num_envs, args.seconds, args.repeats, args.warmup = [64], 1.0, 1, 0.5
    rows = measure(
        args.num_envs,
        args.shapes,
        args.seconds,
        args.repeats,
        args.warmup,
        args.min_get,
        args.loop,
        args.gc_freeze,
    )
    setup = {
        "command": " ".join(["python", *sys.argv]),
        "seconds": args.seconds,
        "repeats": args.repeats,
        "warmup": args.warmup,
        "loop": args.loop,
        "gc_freeze": args.gc_freeze,
        "sigma": SIGMA,
        "mean_latency_ms": 1e3 * MEAN_LATENCY,
        "realised_mean_latency_ms": sum(r.mean_latency_ms * r.draws for r in rows)
        / max(sum(r.draws for r in rows), 1),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "aenvs": aenvs.__version__,
        "torch": torch.__version__,
        "tensordict": tensordict.__version__,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({**setup, "rows": [asdict(r) for r in rows]}, f, indent=2)
        f.write("\n")
    print(f"mean latency drawn over every row: {setup['realised_mean_latency_ms']:.1f} ms")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
