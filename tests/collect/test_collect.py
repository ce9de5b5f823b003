"""aenvs.collect: every transition handed out once, in order, on every executor and loop;
budgets, tasks, batching limits, overlapping policy calls; break, cancellation and errors
leave the pool usable."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
import torch
from tensordict import TensorDictBase

import aenvs
from aenvs import AsyncEnvPool, EnvError, Episode, FrameBatch
from aenvs._tensors import non_tensor_values
from tests.collect.collect_envs import PromptEnv, counting, failing
from tests.conftest import PoolFactory


def first_action(td: TensorDictBase) -> list[int]:
    return [int(i) % 2 for i in td["env_index"].tolist()]


async def async_first_action(td: TensorDictBase) -> list[int]:
    await asyncio.sleep(0)
    return first_action(td)


def check_episode(episode: Episode) -> tuple[int, int]:
    """The episode is one env's consecutive steps from its reset to its end: (env, episode number)."""
    obs, nxt = episode.td["observation"], episode.td["next", "observation"]
    env, number = int(obs[0, 0]), int(obs[0, 1])
    assert env == episode.env_index
    assert (episode.td["env_index"] == env).all()
    assert (episode.td["episode"] == episode.episode_id).all()
    assert obs[:, 2].tolist() == list(range(episode.length))
    assert nxt[:, 2].tolist() == list(range(1, episode.length + 1))
    assert (obs[:, 1] == number).all() and (nxt[:, 1] == number).all()
    done = episode.td["next", "done"].view(-1).tolist()
    assert done == [False] * (episode.length - 1) + [True]
    assert episode.terminated and not episode.truncated
    return env, number


@pytest.mark.parametrize("policy", [first_action, async_first_action], ids=["sync", "async"])
async def test_every_step_comes_back_once_in_its_episode(make_pool: PoolFactory, policy: Any) -> None:
    pool = await make_pool([counting] * 4)
    episodes = [e async for e in aenvs.collect(pool, policy, total_episodes=10)]
    assert len(episodes) == 10 and all(isinstance(e, Episode) for e in episodes)
    seen = Counter(check_episode(e) for e in episodes)
    assert max(seen.values()) == 1  # no episode twice
    assert sorted(e.episode_id for e in episodes) == list(range(10))
    # each env ran its episodes in order, and every step it took was handed out
    steps = await pool.get_attr("steps_taken")
    for env in range(4):
        numbers = sorted(n for e, n in seen if e == env)
        assert numbers == list(range(len(numbers)))
        assert sum(e.length for e in episodes if e.env_index == env) == steps[env]
    assert sum(e.total_reward for e in episodes) == sum(float(e.td["next", "reward"].sum()) for e in episodes)
    assert (await pool.reset()).batch_size == torch.Size([4])  # usable after


async def test_frame_batches_hold_each_transition_once(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 3)
    batches = [b async for b in aenvs.collect(pool, first_action, frames_per_batch=7, total_frames=21)]
    assert [type(b) for b in batches] == [FrameBatch] * 3 and [b.frames for b in batches] == [7, 7, 7]
    assert [b.index for b in batches] == [0, 1, 2]
    rows = [tuple(r) for b in batches for r in b.td["observation"][:, :3].tolist()]
    assert len(set(rows)) == 21  # (env, episode, t): none twice
    for b in batches:
        assert (b.td["env_index"] == b.td["observation"][:, 0]).all()
        assert (b.td["next", "observation"][:, 2] == b.td["observation"][:, 2] + 1).all()
    # the steps still in flight when the budget was spent were abandoned: the pool is usable
    assert (await pool.reset()).batch_size == torch.Size([3])


async def test_episodes_and_frames_in_one_stream(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 2)
    items = [
        x
        async for x in aenvs.collect(pool, first_action, episodes=True, frames_per_batch=4, total_episodes=6)
    ]
    episodes = [x for x in items if isinstance(x, Episode)]
    frames = [x for x in items if isinstance(x, FrameBatch)]
    assert len(episodes) == 6
    assert sum(f.frames for f in frames) == sum(e.length for e in episodes)  # the last batch is the rest
    assert all(f.frames == 4 for f in frames[:-1])


async def test_tasks_from_a_dataset_each_run_once(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 3)
    tasks = [{"tag": k, "length": 1 + k % 3} for k in range(8)]
    episodes = [e async for e in aenvs.collect(pool, first_action, tasks=iter(tasks))]
    assert sorted(int(e.td["observation"][0, 3]) for e in episodes) == list(range(8))
    for e in episodes:
        assert e.task is not None and int(e.td["observation"][0, 3]) == e.task["tag"]
        assert e.length == e.task["length"]


async def test_tasks_per_env_and_a_budget_per_env(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 3)

    def task(env: int, number: int) -> dict[str, int]:
        return {"tag": 100 * env + number, "length": 2}

    episodes = [e async for e in aenvs.collect(pool, first_action, tasks=task, episodes_per_env=2)]
    assert sorted(int(e.td["observation"][0, 3]) for e in episodes) == [0, 1, 100, 101, 200, 201]


async def test_text_envs_with_prompts_and_an_async_policy(make_pool: PoolFactory) -> None:
    pool = await make_pool([PromptEnv] * 3)

    async def policy(td: TensorDictBase) -> list[str]:
        await asyncio.sleep(0)
        return [f"a{len(text)}" for text in non_tensor_values(td["observation"])]

    prompts = [{"prompt": f"p{k}", "turns": 2} for k in range(5)]
    episodes = [e async for e in aenvs.collect(pool, policy, tasks=prompts)]
    assert sorted(e.task["prompt"] for e in episodes) == [f"p{k}" for k in range(5)]
    for e in episodes:
        prompt = e.task["prompt"]
        observations = non_tensor_values(e.td["observation"])
        actions = non_tensor_values(e.td["action"])
        assert observations[0] == prompt and actions[0] == f"a{len(prompt)}"
        assert non_tensor_values(e.td["next", "observation"]) == [
            f"{prompt}|{t + 1}|{a}" for t, a in enumerate(actions)
        ]


async def test_the_policy_output_is_kept_and_batches_respect_max_batch(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 6)
    sizes: list[int] = []

    def policy(td: TensorDictBase) -> TensorDictBase:
        sizes.append(td.batch_size[0])
        td["action"] = torch.ones(td.batch_size[0], dtype=torch.int64)
        td["logits"] = td["observation"][:, 2:3].float()
        return td

    episodes = [e async for e in aenvs.collect(pool, policy, max_batch=4, total_episodes=8)]
    assert max(sizes) <= 4
    for e in episodes:
        assert torch.equal(e.td["logits"][:, 0], e.td["observation"][:, 2].float())
        assert (e.td["action"] == 1).all() and (e.td["next", "reward"] == 2.0).all()


async def test_policy_calls_overlap_up_to_max_policy_calls(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 4)
    running, most = 0, 0
    both = asyncio.Event()

    async def policy(td: TensorDictBase) -> list[int]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        if running == 2:
            both.set()
        try:  # the first call holds until a second one runs beside it (or gives up)
            await asyncio.wait_for(both.wait(), timeout=10)
        finally:
            running -= 1
        return first_action(td)

    async for _ in aenvs.collect(pool, policy, max_policy_calls=2, max_batch=2, total_episodes=6):
        pass
    assert most == 2 and both.is_set()

    most = 0
    async for _ in aenvs.collect(
        pool, first_action_counting(lambda n: None), max_policy_calls=1, total_episodes=3
    ):
        pass


def first_action_counting(seen: Any) -> Any:
    running = 0

    async def policy(td: TensorDictBase) -> list[int]:
        nonlocal running
        running += 1
        assert running == 1, "two policy calls at once with max_policy_calls=1"
        await asyncio.sleep(0)
        running -= 1
        return first_action(td)

    return policy


async def test_max_wait_fills_batches(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 4)
    sizes: list[int] = []

    def policy(td: TensorDictBase) -> list[int]:
        sizes.append(td.batch_size[0])
        return first_action(td)

    # every env is ready within the wait: each batch waits for all four (or the rest)
    async for _ in aenvs.collect(
        pool, policy, max_wait=5.0, max_batch=4, max_policy_calls=1, episodes_per_env=1
    ):
        pass
    assert sizes[0] == 4


async def test_break_and_cancel_leave_the_pool_usable(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 4)
    handed: list[Episode] = []
    async for episode in aenvs.collect(pool, async_first_action):
        handed.append(episode)
        if len(handed) == 3:
            break
    assert (await pool.reset()).batch_size == torch.Size([4])  # at once, on the next line
    for e in handed:
        check_episode(e)

    got_one = asyncio.Event()
    handed = []

    async def consume() -> None:
        async for episode in aenvs.collect(pool, async_first_action):
            handed.append(episode)
            got_one.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(got_one.wait(), timeout=30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await pool.reset()).batch_size == torch.Size([4])
    assert len({e.episode_id for e in handed}) == len(handed)
    for e in handed:
        check_episode(e)

    async with aenvs.collect(pool, first_action) as collector:  # aclose on exit
        async for _ in collector:
            break
    await pool.reset()


async def test_errors_raise_or_skip_and_the_pool_stays_usable(make_pool: PoolFactory) -> None:
    pool = await make_pool([failing] * 3)
    with pytest.raises(EnvError) as caught:
        async for _ in aenvs.collect(pool, first_action, total_episodes=20):
            pass
    assert caught.value.env_index == 1
    await pool.reset()

    pool = await make_pool([failing] * 3)

    def broken(td: TensorDictBase) -> list[int]:
        raise RuntimeError("the policy broke")

    with pytest.raises(RuntimeError, match="the policy broke"):
        async for _ in aenvs.collect(pool, broken):
            pass
    await pool.reset()


async def test_skipping_a_failed_env_loses_no_task(make_pool: PoolFactory) -> None:
    pool = await make_pool([failing] * 3)
    tasks = [{"tag": k, "length": 3} for k in range(6)]
    episodes = [e async for e in aenvs.collect(pool, first_action, tasks=tasks, on_env_error="skip")]
    # env 1's first episode failed: its task was run again, by some env
    assert sorted(e.task["tag"] for e in episodes) == list(range(6))
    for e in episodes:
        check_episode(e)


@pytest.mark.parametrize("shim", [aenvs.SerialEnv, aenvs.ParallelEnv])
def test_sync_iteration_over_the_sync_shim(executor: str, shim: type[aenvs.SerialEnv]) -> None:
    with shim(3, counting, executor=executor) as env:
        episodes = list(aenvs.collect(env, first_action, total_episodes=5))
        assert len(episodes) == 5
        for e in episodes:
            check_episode(e)
        for batch in aenvs.collect(env, first_action, frames_per_batch=4):
            assert batch.frames == 4
            break  # the generator's close stops the collector: the env is usable at once
        assert env.reset().batch_size == torch.Size([3])


async def test_bad_arguments_are_refused_before_anything_runs() -> None:
    async with AsyncEnvPool([counting] * 2, executor="inline") as pool:
        for kwargs, match in [
            ({"frames_per_batch": 0}, "frames_per_batch"),
            ({"max_batch": -1}, "max_batch"),
            ({"max_wait": -0.1}, "max_wait"),
            ({"max_policy_calls": 0}, "max_policy_calls"),
            ({"total_frames": 10}, "frames_per_batch"),
            ({"episodes": False}, "nothing to yield"),
            ({"on_env_error": "ignore"}, "on_env_error"),
        ]:
            with pytest.raises(ValueError, match=match):
                aenvs.collect(pool, first_action, **kwargs)
        with pytest.raises(TypeError, match="async for"):
            iter(aenvs.collect(pool, first_action))
        await pool.reset()


async def test_a_slow_consumer_holds_the_envs_back(make_pool: PoolFactory) -> None:
    pool = await make_pool([counting] * 2)
    collector = aenvs.collect(pool, first_action)
    async with collector:
        first = await anext(aiter(collector))
        check_episode(first)
        for _ in range(300):  # the loop turns many times while the consumer holds on
            await asyncio.sleep(0)
        # at most the backlog (2 x 2 envs) of episodes of at most 5 steps, and one step per env,
        # ran past the first episode: without backpressure the envs would never stop
        assert collector.steps <= 5 * (1 + 4) + 2 * 5
        await anext(aiter(collector))
    await pool.reset()


async def test_a_task_that_keeps_failing_is_given_up_not_retried_forever(make_pool: PoolFactory) -> None:
    # env 1 fails in the first episode it runs, and again after each rebuild: its tasks come
    # back, run elsewhere or fail again, at most three times each; the collection ends
    pool = await make_pool([failing] * 2, on_error="restart", restart_backoff=0.0, max_restarts=100)
    tasks = [{"tag": k, "length": 3} for k in range(6)]
    collector = aenvs.collect(pool, first_action, tasks=tasks, on_env_error="skip")
    episodes = [e async for e in collector]
    ran = [e.task["tag"] for e in episodes]
    given_up = [t["tag"] for t in collector.failed_tasks]
    assert sorted(ran + given_up) == list(range(6))  # each task ran once or was given up once
    assert all(e.env_index == 0 for e in episodes)


async def test_tasks_left_when_every_env_is_retired_are_reported() -> None:
    from aenvs._collect.plan import EpisodePlan

    plan = EpisodePlan(1, tasks=iter([{"tag": 0}, {"tag": 1}]), total_episodes=None, episodes_per_env=None)
    for _ in range(3):  # the same task fails three episodes: given up
        go, task = plan.next(0)
        assert go and task == {"tag": 0}
        plan.give_back(0, task)
    assert plan.failed == [{"tag": 0}]
    go, task = plan.next(0)
    plan.give_back(0, task)
    plan.close()  # no env left to run it
    assert plan.failed == [{"tag": 0}, {"tag": 1}]


async def test_token_list_observations_come_through(make_pool: PoolFactory) -> None:
    from tests.collect.collect_envs import TokensEnv

    pool = await make_pool([TokensEnv] * 2)

    def policy(td: TensorDictBase) -> list[int]:
        return [len(tokens) + 1 for tokens in non_tensor_values(td["observation"])]

    episodes = [e async for e in aenvs.collect(pool, policy, total_episodes=3)]
    for e in episodes:
        assert [list(t) for t in non_tensor_values(e.td["next", "observation"])] == [
            [1, 2],
            [1, 2, 3],
            [1, 2, 3, 4],
        ]
