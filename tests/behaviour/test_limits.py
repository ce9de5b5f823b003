"""Limits: ``max_concurrency`` and a shared ``RateLimit``, enforced by the pool on every executor.

Commands over a limit are held in the pool and count as sent; they move on with nobody
receiving, their timeouts count from their dispatch, and closing or cancelling loses nothing.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from aenvs import AsyncEnvPool, EnvBusyError, PoolClosedError, RateLimit
from aenvs.testing import echo_env_fns
from tests.behaviour.limit_envs import ConcurrencyCounter, counting_env_fns
from tests.helpers import actions, until

# uvloop's clock (loop.time()) counts whole milliseconds: a bound read on it may lose one
CLOCK_GRAIN = 0.001


async def test_max_concurrency_bounds_the_envs_running_at_once(make_pool, tmp_path) -> None:
    pool = await make_pool(counting_env_fns(6, str(tmp_path), delay=0.01), max_concurrency=2)
    await pool.reset()
    for round_ in range(2):
        await pool.async_step_send(actions([float(round_ + 1)] * 6))
        assert pool.stats().held == 4  # 6 sent, 2 dispatched
        seen: list[int] = []
        while len(seen) < 6:
            out = await pool.async_step_recv(min_get=1)
            seen += out["env_index"].tolist()
            assert out["next", "observation"][:, 2].tolist() == [float(round_ + 1)] * len(out)
        assert sorted(seen) == list(range(6))  # every result, each once
    now, highest = ConcurrencyCounter(str(tmp_path)).read()
    assert now == 0 and highest == 2
    stats = pool.stats()
    assert stats.held == 0 and stats.in_flight == 0 and stats.limit_wait_seconds > 0


async def test_held_commands_move_on_with_nobody_receiving(make_pool, tmp_path) -> None:
    pool = await make_pool(counting_env_fns(3, str(tmp_path), delay=0.005), max_concurrency=1)
    await pool.reset()
    await pool.async_step_send(actions([1, 2, 3]))
    files = [os.path.join(tmp_path, f"step-{i}-1") for i in range(3)]
    await until(lambda: all(os.path.exists(f) for f in files))  # the envs' own record, not the pool's
    out = await pool.async_step_recv(min_get=3)
    assert sorted(out["env_index"].tolist()) == [0, 1, 2]


async def test_held_commands_count_as_sent(make_pool, tmp_path) -> None:
    pool = await make_pool(counting_env_fns(3, str(tmp_path), delay=0.01), max_concurrency=1)
    await pool.reset()
    await pool.async_step_send(actions([1, 2, 3]))
    assert pool.stats().held == 2
    with pytest.raises(EnvBusyError):
        await pool.async_step_send(actions([4], env_index=[2]))  # env 2's step is held
    with pytest.raises(ValueError, match="only 3"):
        await pool.async_step_recv(min_get=4)
    out = await pool.async_step_recv(env_index=[2, 1])  # waits for the held ones
    assert out["next", "observation"][:, 1].tolist() == [3.0, 2.0]
    out = await pool.async_step_recv(min_get=1)
    assert out["env_index"].tolist() == [0]


async def test_timeouts_count_from_the_dispatch(make_pool) -> None:
    # one at a time, 8 steps of 100 ms take 800 ms from the send, past the 600 ms timeout of
    # the last two; each one 100 ms from its dispatch (a Ray call slowed by a busy machine
    # has 500 ms to spare)
    pool = await make_pool(echo_env_fns(8, asynchronous=True, delay=0.1), max_concurrency=1, step_timeout=0.6)
    await pool.reset()
    out = await pool.step(actions([1] * 8))
    assert out["next", "observation"][:, 2].tolist() == [1.0] * 8
    assert pool.stats().timeouts == [0] * 8


async def test_rate_limit_bounds_the_dispatch_rate(make_pool) -> None:
    quota = RateLimit(per_second=50.0, burst=2)
    pool = await make_pool(echo_env_fns(4), rate_limit=quota)
    loop = asyncio.get_running_loop()
    start = loop.time()
    await pool.reset()
    for _ in range(2):
        await pool.step(actions([1] * 4))
    elapsed = loop.time() - start
    commands, burst = 12, 2  # 4 resets and 8 steps, one token each
    assert elapsed >= (commands - burst) / 50.0 - CLOCK_GRAIN
    stats = pool.stats()
    assert stats.limit_wait_seconds > 0 and stats.limit_wait.pool_p99 > 0 and stats.held == 0


async def test_a_rate_limit_shared_by_two_pools_bounds_their_sum(make_pool) -> None:
    quota = RateLimit(per_second=50.0)
    pools = [await make_pool(echo_env_fns(2), rate_limit=quota) for _ in range(2)]

    async def run(pool: AsyncEnvPool) -> None:
        await pool.reset()
        for _ in range(2):
            await pool.step(actions([1, 1]))

    loop = asyncio.get_running_loop()
    start = loop.time()
    await asyncio.gather(*(run(pool) for pool in pools))
    elapsed = loop.time() - start
    commands = 12  # 6 per pool: alone, each would take (6 - 1) / 50 s
    assert elapsed >= (commands - 1) / 50.0 - CLOCK_GRAIN


async def test_close_drops_held_commands(executor, tmp_path) -> None:
    pool = AsyncEnvPool(counting_env_fns(4, str(tmp_path), delay=0.01), executor=executor, max_concurrency=1)
    async with pool:
        await pool.reset()
        await pool.async_step_send(actions([1, 2, 3, 4]))
        assert pool.stats().held == 3
    stats = pool.stats()
    assert stats.held == 0 and stats.in_flight <= 1  # the one dispatched may not have answered
    await asyncio.sleep(0)  # a cancelled task ends at the loop's next turn
    movers = [t for t in asyncio.all_tasks() if "_move_on" in t.get_coro().__qualname__]  # type: ignore[union-attr]
    assert movers == []
    with pytest.raises(PoolClosedError):
        await pool.async_step_send(actions([1], env_index=[0]))


async def test_cancelling_a_whole_batch_call_with_held_commands_loses_nothing(make_pool, tmp_path) -> None:
    pool = await make_pool(counting_env_fns(4, str(tmp_path), delay=0.01), max_concurrency=1)
    await pool.reset()
    task = asyncio.create_task(pool.step(actions([1, 1, 1, 1])))
    await until(lambda: pool.stats().held > 0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert pool.has_abandoned
    out = await pool.step(actions([2, 2, 2, 2]))  # drops the abandoned results first
    assert out["next", "observation"][:, 2].tolist() == [2.0] * 4  # every env stepped twice: none lost
    assert out["next", "observation"][:, 1].tolist() == [2.0] * 4
    stats = pool.stats()
    assert stats.held == 0 and stats.in_flight == 0 and stats.ready == 0 and not pool.has_abandoned


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="max_concurrency"):
        AsyncEnvPool(echo_env_fns(2), max_concurrency=0)
    with pytest.raises(TypeError, match="max_concurrency"):
        AsyncEnvPool(echo_env_fns(2), max_concurrency=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="rate_limit"):
        AsyncEnvPool(echo_env_fns(2), rate_limit=10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="per_second"):
        RateLimit(per_second=0)
    with pytest.raises(ValueError, match="burst"):
        RateLimit(per_second=1.0, burst=0)
    with pytest.raises(TypeError, match="burst"):
        RateLimit(per_second=1.0, burst=1.5)  # type: ignore[arg-type]
