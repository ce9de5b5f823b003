"""The thread executor's threads: shared by the workers (the default) or pinned to one.

A worker's commands run one at a time, in the order sent, whichever thread runs them;
``pinned=True`` keeps every command of a worker on the thread that built its envs.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict

from aenvs import AsyncEnvPool, Env, EnvContext, EnvTimeoutError
from aenvs.executors import ThreadExecutor
from aenvs.testing import Fault, faulty_env_fns
from tests.faults.support import collect, echo_actions


class Ledger:
    """What the envs of one pool saw: per worker, the envs running now and the order of
    the steps it ran; per env, the thread that built it and the threads that stepped it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: dict[int, int] = defaultdict(int)
        self.overlaps = 0  # steps that began while another env of their worker was running
        self.order: dict[int, list[tuple[int, int]]] = defaultdict(list)  # worker -> (env, step)
        self.builder: dict[int, int] = {}
        self.steppers: dict[int, set[int]] = defaultdict(set)
        self.release: dict[int, threading.Event] = {}  # env -> its step waits for it, if there
        self.started: dict[int, threading.Event] = defaultdict(threading.Event)


class LedgerEnv(Env):
    """Records each step in its pool's ledger; a step whose env has an event in
    ``ledger.release`` waits for it."""

    observation_space = spaces.Box(0, 1_000_000, (1,), np.float32)
    action_space = spaces.Box(0, 1_000_000, (1,), np.float32)

    def __init__(self, context: EnvContext, ledger: Ledger) -> None:
        self.index, self.worker, self.ledger = context.env_index, context.worker_index, ledger
        ledger.builder[self.index] = threading.get_ident()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> TensorDict:
        return TensorDict(observation=torch.zeros(1))

    def step(self, td: TensorDict) -> dict[str, Any]:
        ledger, step = self.ledger, int(td["action"].item())
        with ledger.lock:
            ledger.running[self.worker] += 1
            ledger.overlaps += ledger.running[self.worker] > 1
            ledger.order[self.worker].append((self.index, step))
            ledger.steppers[self.index].add(threading.get_ident())
        ledger.started[self.index].set()
        release = ledger.release.get(self.index)
        if release is not None:
            release.wait(10)
        with ledger.lock:
            ledger.running[self.worker] -= 1
        return {"observation": np.full(1, step, np.float32), "reward": 0.0, "terminated": False}


def actions(steps: list[int]) -> torch.Tensor:
    return torch.tensor(steps, dtype=torch.float32).reshape(-1, 1)


@pytest.mark.parametrize("pinned", [False, True], ids=["shared", "pinned"])
async def test_a_workers_commands_run_one_at_a_time_in_the_order_sent(pinned: bool) -> None:
    ledger, rng, n = Ledger(), random.Random(0), 8
    fns = [lambda ctx: LedgerEnv(ctx, ledger)] * n
    executor = ThreadExecutor(envs_per_worker=2, pinned=pinned)  # 4 workers of 2 envs, 4 threads
    sent: dict[int, list[tuple[int, int]]] = defaultdict(list)  # worker -> (env, step), as sent
    async with AsyncEnvPool(fns, executor=executor) as pool:
        await pool.reset()
        step = 0
        for _ in range(60):
            # each env of the batch sent on its own, in a random order: the two envs of a
            # worker often queue behind each other while the other threads are free
            batch = rng.sample(range(n), rng.randint(1, n))
            for i in batch:
                step += 1
                sent[i // 2].append((i, step))
                await pool.async_step_send(
                    TensorDict(action=actions([step]), env_index=torch.tensor([i]), batch_size=[1])
                )
            out = await pool.async_step_recv(min_get=len(batch), timeout=30)
            rows = out["env_index"].tolist()
            assert out["next", "observation"][:, 0].tolist() == out["action"][:, 0].tolist(), rows
    assert ledger.overlaps == 0
    assert dict(ledger.order) == dict(sent)


async def test_pinned_envs_run_on_the_thread_that_built_them() -> None:
    # Env 0's step waits until env 1 has stepped: with any thread free to run any
    # command, env 1 would run on env 0's thread about half the rounds.
    ledger, rng = Ledger(), random.Random(1)
    fns = [lambda ctx: LedgerEnv(ctx, ledger)] * 2
    async with AsyncEnvPool(fns, executor=ThreadExecutor(pinned=True)) as pool:
        await pool.reset()
        for step in range(1, 21):
            first = rng.randrange(2)
            ledger.release = {first: threading.Event()}
            ledger.started[first].clear()
            one = TensorDict(action=actions([step]), env_index=torch.tensor([first]), batch_size=[1])
            await pool.async_step_send(one)
            assert await asyncio.to_thread(ledger.started[first].wait, 10)
            other = TensorDict(action=actions([step]), env_index=torch.tensor([1 - first]), batch_size=[1])
            await pool.async_step_send(other)
            out = await pool.async_step_recv(env_index=[1 - first], timeout=10)
            assert out["env_index"].tolist() == [1 - first]
            ledger.release[first].set()
            await pool.async_step_recv(env_index=[first], timeout=10)
    assert {i: {ledger.builder[i]} for i in range(2)} == dict(ledger.steppers)


@pytest.mark.parametrize("pinned", [False, True], ids=["shared", "pinned"])
async def test_a_thread_stuck_in_an_env_is_abandoned_and_its_env_restarts(
    pinned: bool, tmp_path: Path
) -> None:
    release = tmp_path / "release"
    fns = faulty_env_fns(3, {1: Fault("hang", at=2, release=str(release))})
    executor = ThreadExecutor(pinned=pinned)
    pool = AsyncEnvPool(fns, executor=executor, step_timeout=0.5, on_error="restart", restart_backoff=0)
    try:
        await pool.start()
        await pool.reset()
        await pool.step(echo_actions(3))
        await pool.async_step_send(echo_actions(3))
        results, errors = await collect(pool, 3)
        assert results["env_index"].tolist() == [0, 2]
        assert [(type(e), e.env_index) for e in errors] == [(EnvTimeoutError, 1)]
        assert executor.abandoned_threads == 1
        await pool.reset()  # env 1 restarted on a new worker: every env steps again
        out = await pool.step(echo_actions(3))
        assert out["next", "observation"][:, 0].tolist() == [0.0, 1.0, 2.0]
        assert pool.stats().restarts == [0, 1, 0]
    finally:
        release.touch()  # the abandoned thread can end now
        await pool.aclose()


class PolicyEnv(Env):
    """Observes the scheduling policy of the thread that steps it and of a thread it starts."""

    observation_space = spaces.Box(0, 100, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> TensorDict:
        return TensorDict(observation=torch.zeros(2))

    def step(self, td: TensorDict) -> dict[str, Any]:
        started: list[int] = []
        thread = threading.Thread(target=lambda: started.append(os.sched_getscheduler(0)))
        thread.start()
        thread.join()
        policies = np.array([os.sched_getscheduler(0), started[0]], np.float32)
        return {"observation": policies, "reward": 0.0, "terminated": False}


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")
@pytest.mark.parametrize("batch_scheduling", [True, False], ids=["batch", "default"])
@pytest.mark.parametrize("pinned", [False, True], ids=["shared", "pinned"])
async def test_threads_run_under_sched_batch_and_the_loops_thread_keeps_its_policy(
    pinned: bool, batch_scheduling: bool
) -> None:
    loops_policy = os.sched_getscheduler(0)
    executor = ThreadExecutor(pinned=pinned, batch_scheduling=batch_scheduling)
    async with AsyncEnvPool([PolicyEnv] * 3, executor=executor) as pool:
        await pool.reset()
        out = await pool.step(TensorDict(action=torch.zeros(3, dtype=torch.int64), batch_size=[3]))
    expected = os.SCHED_BATCH if batch_scheduling else loops_policy
    assert out["next", "observation"].tolist() == [[expected, expected]] * 3
    assert os.sched_getscheduler(0) == loops_policy
