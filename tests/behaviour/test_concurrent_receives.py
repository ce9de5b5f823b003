"""Receives awaited at the same time by several tasks: served fairly, refused at once, never hung.

A waiting receive naming ``env_index`` holds those envs; one for any env claims
``min_get`` of the results nobody holds. A receive that could only be satisfied with what
another waiting receive holds or claims raises ValueError at once; a waiting receive
whose results are dropped meanwhile raises at once too.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Coroutine
from typing import Any

import pytest
from tensordict import TensorDictBase

from aenvs import AsyncEnvPool
from aenvs.testing import EchoEnv, echo_env_fns
from tests.faults.support import WAIT, echo_actions
from tests.helpers import Gate, gated_env_fns

N = 4


async def _waiting(pool: AsyncEnvPool, count: int) -> None:
    """Return once ``count`` receives wait for results (each registers in its first loop turn)."""
    async with asyncio.timeout(WAIT):
        while pool.stats().receiving < count:  # noqa: ASYNC110 - a condition checked each loop turn
            await asyncio.sleep(0)


def _start(receive: Coroutine[Any, Any, TensorDictBase]) -> asyncio.Task[TensorDictBase]:
    return asyncio.get_running_loop().create_task(receive)


class _LoopGate:
    """For the inline executor: envs awaiting one asyncio.Event, all released in one loop turn
    (the worst case for receives racing for the same results)."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    def open(self) -> None:
        self.event.set()


class _LoopGatedEnv(EchoEnv):
    def __init__(self, gate: _LoopGate, env_index: int) -> None:
        super().__init__(env_index=env_index)
        self.gate = gate

    async def step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        await self.gate.event.wait()
        return self._advance(td)


async def _gated_pool(make_pool, executor: str, tmp_path) -> tuple[AsyncEnvPool, Gate | _LoopGate]:
    """A pool of N envs whose steps, sent already, finish once the gate opens."""
    if executor == "inline":
        gate: Gate | _LoopGate = _LoopGate()
        pool = await make_pool([lambda ctx, gate=gate: _LoopGatedEnv(gate, ctx.env_index)] * N)
    else:
        gate = Gate(str(tmp_path))
        pool = await make_pool(gated_env_fns(N, gate))
    await pool.reset()
    await pool.async_step_send(echo_actions(N))
    return pool, gate


async def test_a_receive_that_others_leave_nothing_for_is_refused_at_once(
    make_pool, executor: str, tmp_path
) -> None:
    pool, gate = await _gated_pool(make_pool, executor, tmp_path)
    everything = _start(pool.async_step_recv(min_get=N))
    await _waiting(pool, 1)
    with pytest.raises(ValueError, match="not held or claimed by other waiting receives"):
        async with asyncio.timeout(WAIT):
            await pool.async_step_recv(min_get=1)
    with pytest.raises(ValueError, match="other waiting receives claim"):
        async with asyncio.timeout(WAIT):
            await pool.async_step_recv(env_index=[0])
    gate.open()
    async with asyncio.timeout(WAIT):
        out = await everything
    assert out["env_index"].tolist() == list(range(N))
    assert pool.stats().receiving == 0 and pool.stats().in_flight == 0


async def test_receives_for_half_each_get_half_each(make_pool, executor: str, tmp_path) -> None:
    pool, gate = await _gated_pool(make_pool, executor, tmp_path)
    first = _start(pool.async_step_recv(min_get=N // 2))
    second = _start(pool.async_step_recv(min_get=N // 2))
    await _waiting(pool, 2)
    gate.open()
    async with asyncio.timeout(WAIT):
        a, b = await asyncio.gather(first, second)
    assert a.batch_size[0] == N // 2 and b.batch_size[0] == N // 2
    assert sorted(a["env_index"].tolist() + b["env_index"].tolist()) == list(range(N))


async def test_a_receive_naming_envs_keeps_them_from_one_for_any(make_pool, executor: str, tmp_path) -> None:
    pool, gate = await _gated_pool(make_pool, executor, tmp_path)
    named = _start(pool.async_step_recv(env_index=[0, 1]))
    await _waiting(pool, 1)
    anyone = _start(pool.async_step_recv(min_get=2))
    await _waiting(pool, 2)
    with pytest.raises(ValueError, match="awaited by another receive"):
        await pool.async_step_recv(env_index=[1, 2])
    gate.open()
    async with asyncio.timeout(WAIT):
        a, b = await asyncio.gather(named, anyone)
    assert a["env_index"].tolist() == [0, 1]
    assert b["env_index"].tolist() == [2, 3]


async def test_a_waiting_receive_whose_results_are_dropped_raises_at_once(make_pool, tmp_path) -> None:
    gate = Gate(str(tmp_path))
    pool = await make_pool(gated_env_fns(N, gate))
    await pool.reset()
    # a whole-batch step, cancelled while its envs step: its results are dropped on arrival
    stepping = _start(pool.step(echo_actions(N)))
    await _waiting(pool, 1)
    stepping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stepping
    resetting = _start(pool.reset())  # first waits for those results, to drop them
    anyone = _start(pool.async_step_recv(min_get=N))  # starts after it, asking for the same results
    await _waiting(pool, 1)
    gate.open()
    with pytest.raises(ValueError, match="can still come to it"):
        async with asyncio.timeout(WAIT):
            await anyone
    async with asyncio.timeout(WAIT):
        out = await resetting
    assert out["env_index"].tolist() == list(range(N))
    assert pool.stats().receiving == 0


@pytest.mark.parametrize("seed", range(3))
async def test_random_concurrent_receives_lose_and_duplicate_nothing(make_pool, seed: int) -> None:
    """Rounds of every env stepped once and three tasks receiving at once with random bounds:
    each either gets results or is refused at once; a last receive takes what is left; every
    env's result arrives exactly once."""
    rng = random.Random(seed)
    pool = await make_pool(echo_env_fns(6, asynchronous=True, delay=(0.0, 0.004)))
    await pool.reset()
    for _ in range(4):
        await pool.async_step_send(echo_actions(6))
        receives = []
        for _ in range(3):
            min_get = rng.randint(0, 3)
            max_get = rng.choice([None, max(min_get, 1), min_get + 2])
            receives.append(_start(pool.async_step_recv(min_get=min_get, max_get=max_get)))
        async with asyncio.timeout(WAIT):
            outcomes = await asyncio.gather(*receives, return_exceptions=True)
        received: list[int] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                assert isinstance(outcome, ValueError), outcome
                continue
            received += outcome["env_index"].tolist()
        left = 6 - len(received)
        if left:
            async with asyncio.timeout(WAIT):
                received += (await pool.async_step_recv(min_get=left))["env_index"].tolist()
        assert sorted(received) == list(range(6)), received
        stats = pool.stats()
        assert stats.in_flight == 0 and stats.ready == 0 and stats.receiving == 0
