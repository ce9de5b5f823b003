"""A collector stops where you leave it, however you hold it: a ``break`` starts nothing new,
your next pool call takes the pool back (the steps in flight received and kept, none lost),
get_attr only pauses it, a collector in use is named when another caller needs the pool, and
the tasks it took and did not hand out are reported."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
import torch
from tensordict import TensorDictBase

import aenvs
from aenvs import EnvBusyError, Episode
from tests.collect.collect_envs import counting
from tests.collect.test_collect import async_first_action, check_episode, first_action
from tests.conftest import PoolFactory


async def steps_taken(pool: aenvs.AsyncEnvPool) -> int:
    return sum(await pool.get_attr("steps_taken"))


async def check_stopped_by_the_pool_call(pool: aenvs.AsyncEnvPool, collector: aenvs.Collector[Any]) -> None:
    """Right after a pool call that took the pool back: every step the envs took was received by
    the collector (none lost in flight), and it takes none more while the pool works."""
    taken = await steps_taken(pool)
    assert taken == collector.steps
    await pool.rollout(5, break_when_any_done=False)  # the loop turns: a collector still running would step
    assert collector.steps == taken
    assert await steps_taken(pool) == taken + 5 * pool.num_envs


async def test_a_break_with_the_collector_kept_frees_the_pool_on_the_next_line(
    make_pool: PoolFactory,
) -> None:
    pool = await make_pool([counting] * 4)
    collector = aenvs.collect(pool, async_first_action)
    async for episode in collector:
        check_episode(episode)
        break
    assert (await pool.reset()).batch_size == torch.Size([4])
    await check_stopped_by_the_pool_call(pool, collector)
    # the episodes it finished while stopping are still handed out, each once, then it ends
    rest = [e async for e in collector]
    assert len({e.episode_id for e in rest} | {episode.episode_id}) == len(rest) + 1
    for e in rest:
        check_episode(e)


async def test_a_break_inside_async_with_frees_the_pool_inside_the_block(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 4)
    async with aenvs.collect(pool, async_first_action) as collector:
        async for episode in collector:
            check_episode(episode)
            break
        assert (await pool.reset()).batch_size == torch.Size([4])
        await check_stopped_by_the_pool_call(pool, collector)
    await pool.reset()


async def test_a_new_collector_takes_the_pool_from_one_left_by_a_break(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 3)
    first = aenvs.collect(pool, async_first_action)
    async for _ in first:
        break
    episodes = [e async for e in aenvs.collect(pool, first_action, total_episodes=6)]
    assert len(episodes) == 6
    for e in episodes:
        check_episode(e)
    assert first.steps + sum(e.length for e in episodes) == await steps_taken(pool)


async def test_get_attr_inside_the_loop_pauses_the_collection(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 3)
    episodes: list[Episode] = []
    collector = aenvs.collect(pool, async_first_action, total_episodes=9)
    async for episode in collector:
        episodes.append(episode)
        seen = await pool.get_attr("steps_taken")  # the collector pauses around it, then goes on
        assert sum(seen) == collector.steps  # what it had in flight was received first
    assert len(episodes) == 9
    for e in episodes:
        check_episode(e)
    assert sum(e.length for e in episodes) == await steps_taken(pool)


@pytest.mark.parametrize("max_wait", [None, 0.002])
async def test_get_attr_from_another_task_runs_beside_the_collection(
    make_pool: PoolFactory, max_wait: float | None
) -> None:
    pool = await make_pool([counting] * 4)
    collector = aenvs.collect(pool, async_first_action, total_episodes=24, max_wait=max_wait, max_batch=3)
    looks, over = 0, asyncio.Event()

    async def monitor() -> None:
        nonlocal looks
        while not over.is_set():
            await pool.get_attr("steps_taken")
            looks += 1
            await asyncio.sleep(0)

    watching = asyncio.create_task(monitor())
    try:
        episodes = [e async for e in collector]
    finally:
        over.set()
        await watching
    assert len(episodes) == 24 and looks > 0
    for e in episodes:
        check_episode(e)
    assert sum(e.length for e in episodes) == await steps_taken(pool)


async def test_a_collector_in_use_is_named_when_another_caller_needs_the_pool(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 2)
    called, release = asyncio.Event(), asyncio.Event()

    async def held_policy(td: TensorDictBase) -> list[int]:
        called.set()
        await release.wait()
        return first_action(td)

    running = aenvs.collect(pool, held_policy)

    async def next_episode() -> Episode:
        return await anext(aiter(running))

    consumer = asyncio.create_task(next_episode())  # a task waits for its next item
    await asyncio.wait_for(called.wait(), timeout=30)
    with pytest.raises(EnvBusyError, match=r"a collector \(aenvs.collect\) holds this pool.*aclose"):
        await anext(aiter(aenvs.collect(pool, first_action)))
    with pytest.raises(EnvBusyError, match="holds this pool"):
        await pool.reset()
    assert len(await pool.get_attr("steps_taken")) == 2  # a visit runs beside it
    release.set()
    check_episode(await asyncio.wait_for(consumer, timeout=30))
    await running.aclose()
    assert (await pool.reset()).batch_size == torch.Size([2])


async def test_the_tasks_taken_and_not_handed_out_are_reported_in_order(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 4)
    tasks = [{"tag": k, "length": 2 + k % 3} for k in range(100)]
    source = iter(tasks)
    collector = aenvs.collect(pool, first_action, tasks=source)
    handed: list[Episode] = []
    async for episode in collector:
        handed.append(episode)
        if len(handed) == 3:
            break
    assert collector.unfinished_tasks  # the episodes running when the loop broke
    await pool.reset()  # takes the pool back: the collector stops
    left = collector.unfinished_tasks
    following = next(source)
    taken = sorted(t["tag"] for t in [*(e.task for e in handed), *left])
    assert taken == list(range(following["tag"]))  # every task taken is handed out or reported
    assert [t["tag"] for t in left] == sorted(t["tag"] for t in left)  # in the order taken
    handed += [e async for e in collector]  # the episodes finished while it stopped
    assert [t["tag"] for t in collector.unfinished_tasks] == [
        t["tag"] for t in left if t["tag"] not in {e.task["tag"] for e in handed}
    ]
    resumed = itertools.chain(collector.unfinished_tasks, [following], source)
    handed += [e async for e in aenvs.collect(pool, first_action, tasks=resumed)]
    assert sorted(e.task["tag"] for e in handed) == list(range(100))  # no gap, none twice
    for e in handed:
        check_episode(e)
        assert int(e.td["observation"][0, 3]) == e.task["tag"]


@pytest.mark.parametrize("driver", ["private", "portal"])
def test_a_held_sync_iterator_stops_at_the_next_call_on_the_env(
    executor: str, driver: Any, loop_factory: Any
) -> None:
    with aenvs.SerialEnv(3, counting, executor=executor, loop=driver, loop_factory=loop_factory) as env:
        collector = aenvs.collect(env, first_action)
        episodes = iter(collector)
        check_episode(next(episodes))
        assert env.reset().batch_size == torch.Size([3])
        taken = sum(env.get_attr("steps_taken"))
        assert taken == collector.steps
        env.rollout(5, break_when_any_done=False)
        assert collector.steps == taken
        assert sum(env.get_attr("steps_taken")) == taken + 15
