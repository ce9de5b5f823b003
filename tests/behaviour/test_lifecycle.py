"""Starting, closing, properties, seeding and env states."""

from __future__ import annotations

import pytest
import torch

from aenvs import AsyncEnvPool, EnvError, EnvState, PoolClosedError
from aenvs._seeding import seed_chain
from aenvs.testing import echo_env_fns
from tests.helpers import actions


async def test_async_with_starts_and_closes(executor: str) -> None:
    pool = AsyncEnvPool(echo_env_fns(3), executor=executor)
    assert "not started" in repr(pool)
    async with pool:
        assert pool.num_envs == 3
        assert pool.batch_size == torch.Size([3])
        assert pool.env_states == [EnvState.INIT] * 3
        assert [s.action_space.shape for s in pool.env_specs] == [(1,)] * 3
        td = await pool.reset()
        assert td["observation"][:, 0].tolist() == [0.0, 1.0, 2.0]
    assert pool.is_closed
    await pool.aclose()  # idempotent


async def test_every_call_after_close_raises_pool_closed(executor: str) -> None:
    pool = AsyncEnvPool(echo_env_fns(2), executor=executor)
    async with pool:
        await pool.reset()
    with pytest.raises(PoolClosedError):
        await pool.reset()
    with pytest.raises(PoolClosedError):
        await pool.async_step_send(actions([1, 1]))
    with pytest.raises(PoolClosedError):
        await pool.async_step_recv()
    with pytest.raises(PoolClosedError):
        await pool.get_attr("steps")
    with pytest.raises(PoolClosedError):
        await pool.start()


async def test_calls_before_start_say_how_to_start(executor: str) -> None:
    pool = AsyncEnvPool(echo_env_fns(1), executor=executor)
    with pytest.raises(RuntimeError, match="async with"):
        await pool.reset()
    await pool.aclose()


async def test_single_factory_with_num_envs_and_env_context(make_pool) -> None:
    pool = await make_pool(echo_env_fns(1)[0], num_envs=4)
    td = await pool.reset()
    assert td["observation"][:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert td["env_index"].tolist() == [0, 1, 2, 3]


def test_bad_constructor_arguments_are_rejected() -> None:
    with pytest.raises(ValueError, match="num_envs=3 but 2"):
        AsyncEnvPool(echo_env_fns(2), num_envs=3)
    with pytest.raises(ValueError, match="at least one"):
        AsyncEnvPool([])
    with pytest.raises(ValueError, match="stack"):
        AsyncEnvPool(echo_env_fns(1), stack="tight")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown executor"):
        AsyncEnvPool(echo_env_fns(1), executor="fiber")


async def test_factory_that_raises_names_the_env(executor: str) -> None:
    def broken() -> None:
        raise RuntimeError("no simulator licence")

    fns = [*echo_env_fns(2), broken]
    pool = AsyncEnvPool(fns, executor=executor)
    with pytest.raises(EnvError) as info:
        await pool.start()
    assert info.value.env_index == 2
    assert info.value.command == "make"
    assert "no simulator licence" in info.value.remote_traceback
    assert pool.is_closed


async def test_gymnasium_ids_with_make_kwargs(make_pool) -> None:
    pool = await make_pool("CartPole-v1", num_envs=2, make_kwargs={"max_episode_steps": 3})
    td = await pool.reset()
    td["action"] = torch.zeros(2, dtype=torch.int64)
    for _ in range(3):
        out = await pool.step(td)
        td["observation"] = out["next", "observation"]
    assert out["next", "truncated"].all()
    assert pool.env_states == [EnvState.DONE] * 2


async def test_pool_seed_makes_first_reset_reproducible(make_pool) -> None:
    a = await make_pool("CartPole-v1", num_envs=3, seed=11)
    b = await make_pool("CartPole-v1", num_envs=3, seed=11)
    c = await make_pool("CartPole-v1", num_envs=3, seed=12)
    obs_a, obs_b, obs_c = [(await p.reset())["observation"] for p in (a, b, c)]
    assert torch.equal(obs_a, obs_b)
    assert not torch.equal(obs_a, obs_c)
    assert not torch.equal(obs_a[0], obs_a[1])  # each env has its own seed


async def test_set_seed_follows_the_torchrl_chain(make_pool) -> None:
    a = await make_pool("CartPole-v1", num_envs=3)
    b = await make_pool("CartPole-v1", num_envs=3)
    assert await a.set_seed(5) == seed_chain(5, 3)[1]
    await b.set_seed(5)
    assert a.env_states == [EnvState.INIT] * 3
    assert torch.equal((await a.reset())["observation"], (await b.reset())["observation"])


async def test_reset_with_seed_sequence_and_options(make_pool) -> None:
    pool = await make_pool("CartPole-v1", num_envs=2)
    first = await pool.reset(seed=[3, 3])
    assert torch.equal(first["observation"][0], first["observation"][1])
    again = await pool.reset(seed=[3, 4], options={"low": -0.01, "high": 0.01})
    assert not torch.equal(again["observation"][0], again["observation"][1])
    assert again["observation"].abs().max() <= 0.01


async def test_env_states_follow_the_episode(make_pool) -> None:
    pool = await make_pool(echo_env_fns(2, episode_length=2))
    assert pool.env_states == [EnvState.INIT] * 2
    await pool.reset()
    assert pool.env_states == [EnvState.RUN] * 2
    await pool.step(actions([1, 1]))
    assert pool.env_states == [EnvState.RUN] * 2
    await pool.step(actions([1, 1]))
    assert pool.env_states == [EnvState.DONE] * 2
    with pytest.raises(EnvError):
        await pool.step(actions([-1], env_index=[0]))
    assert pool.env_states == [EnvState.ERROR, EnvState.DONE]


async def test_stats_count_steps_and_latency(make_pool) -> None:
    pool = await make_pool(echo_env_fns(2))
    await pool.reset()
    for _ in range(3):
        await pool.step(actions([1, 1]))
    stats = pool.stats()
    assert stats.steps == [3, 3]
    assert stats.in_flight == 0 and stats.ready == 0
    assert all(latency > 0 for latency in stats.step_latency_mean)
    assert stats.steps_per_second > 0
    await pool.async_step_send(actions([1], env_index=[1]))
    assert pool.stats().in_flight + pool.stats().ready == 1
    await pool.async_step_recv()
