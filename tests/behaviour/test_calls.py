"""call / get_attr / set_attr on every env or a subset."""

from __future__ import annotations

import pytest

from aenvs import EnvBusyError
from aenvs.testing import echo_env_fns
from tests.helpers import actions


async def test_get_and_set_attr_on_all_and_a_subset(make_pool) -> None:
    pool = await make_pool(echo_env_fns(3))
    assert await pool.get_attr("env_index") == [0, 1, 2]
    await pool.set_attr("episode_length", 7, env_index=[0, 2])
    assert await pool.get_attr("episode_length") == [7, None, 7]
    assert await pool.get_attr("episode_length", env_index=2) == [7]


async def test_call_forwards_arguments_and_returns_one_value_per_env(make_pool) -> None:
    pool = await make_pool(echo_env_fns(3))
    await pool.reset()
    await pool.step(actions([1, 1, 1]))
    assert await pool.call("_delay") == [0.0, 0.0, 0.0]
    out = await pool.call("_obs", 5.0, env_index=[1])
    assert out[0].tolist() == [1.0, 5.0, 1.0]


async def test_gymnasium_attributes_through_wrappers(make_pool) -> None:
    pool = await make_pool("CartPole-v1", num_envs=2)
    assert await pool.get_attr("gravity") == [9.8, 9.8]
    await pool.set_attr("gravity", 3.7)
    assert await pool.get_attr("gravity") == [3.7, 3.7]
    assert await pool.call("get_wrapper_attr", "gravity", env_index=[1]) == [3.7]


async def test_calls_to_a_busy_env_raise(make_pool) -> None:
    pool = await make_pool(echo_env_fns(2))
    await pool.reset()
    await pool.async_step_send(actions([1], env_index=[1]))
    with pytest.raises(EnvBusyError) as info:
        await pool.call("_delay")
    assert info.value.env_index == 1
    assert await pool.get_attr("steps", env_index=[0]) == [0]  # an idle env is fine
    await pool.async_step_recv()
    assert await pool.get_attr("steps") == [0, 1]
