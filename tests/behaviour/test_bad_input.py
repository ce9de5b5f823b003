"""Bad input gets a clear error naming the argument (or env and key) before anything is
dispatched, and the pool stays usable: env indices, the loop a pool is used from, rewards."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from aenvs import AsyncEnvPool, EnvError
from aenvs._env import Env
from aenvs.testing import echo_env_fns
from tests.faults.support import echo_actions

N = 3

BAD_ENV_INDICES: list[tuple[Any, str]] = [
    ([1.5], r"env_index\[0\] is 1.5 \(float\)"),
    ([1.0], r"env_index\[0\] is 1.0 \(float\)"),
    (1.0, r"env_index is 1.0 \(float\)"),
    (True, "env_index is True"),
    ([True], r"env_index\[0\] is True"),
    (np.float64(1.0), r"env_index is np.float64\(1.0\) \(float64\)"),
    (torch.tensor([1.0]), "env_index is a torch.float32 tensor"),
    (np.array([1.0]), "env_index is an array of float64"),
    ("1", "env_index is '1' \\(str\\)"),
    ([None], r"env_index\[0\] is None"),
]


async def _still_usable(pool: AsyncEnvPool) -> None:
    stats = pool.stats()
    assert stats.in_flight == 0 and stats.ready == 0, "something was dispatched"
    out = await pool.step(echo_actions(N))
    assert out["env_index"].tolist() == list(range(N))


@pytest.mark.parametrize(("env_index", "message"), BAD_ENV_INDICES, ids=[repr(b) for b, _ in BAD_ENV_INDICES])
async def test_an_env_index_that_is_not_integers_is_refused(make_pool, env_index: Any, message: str) -> None:
    pool = await make_pool(echo_env_fns(N))
    await pool.reset()
    calls: list[Callable[[], Any]] = [
        lambda: pool.async_step_send(echo_actions(1), env_index=env_index),
        lambda: pool.step(echo_actions(1), env_index=env_index),
        lambda: pool.reset(env_index=env_index),
        lambda: pool.async_step_recv(env_index=env_index),
        lambda: pool.call("reset", env_index=env_index),
    ]
    for call in calls:
        with pytest.raises(TypeError, match=message):
            await call()
    await _still_usable(pool)


async def test_an_env_index_entry_that_is_not_integers_is_refused(make_pool) -> None:
    pool = await make_pool(echo_env_fns(N))
    await pool.reset()
    td = echo_actions(1)
    td["env_index"] = torch.tensor([1.0])
    with pytest.raises(TypeError, match=r"the input's 'env_index' entry is a torch\.float32 tensor"):
        await pool.async_step_send(td)
    await _still_usable(pool)


@pytest.mark.parametrize("empty", [[], torch.tensor([], dtype=torch.long)], ids=["list", "tensor"])
async def test_an_empty_env_index_is_refused(make_pool, empty: Any) -> None:
    pool = await make_pool(echo_env_fns(N))
    await pool.reset()
    with pytest.raises(ValueError, match="env_index is empty"):
        await pool.async_step_send(echo_actions(0), env_index=empty)
    with pytest.raises(ValueError, match="env_index is empty"):
        await pool.async_step_recv(env_index=empty)
    await _still_usable(pool)


async def test_integers_of_every_kind_and_boolean_masks_are_env_indices(make_pool) -> None:
    pool = await make_pool(echo_env_fns(N))
    await pool.reset()
    for env_index, expected in [
        (np.int64(2), [2]),
        ([np.int32(2), 0], [2, 0]),
        (np.array([2, 0], dtype=np.uint8), [2, 0]),
        (torch.tensor([2, 0], dtype=torch.int32), [2, 0]),
        ([torch.tensor(1)], [1]),
        (torch.tensor([True, False, True]), [0, 2]),
        (np.array([False, True, False]), [1]),
    ]:
        out = await pool.step(echo_actions(len(expected)), env_index=env_index)
        assert out["env_index"].tolist() == expected
        await pool.async_step_send(echo_actions(len(expected)), env_index=env_index)
        out = await pool.async_step_recv(env_index=env_index)
        assert out["env_index"].tolist() == expected
    with pytest.raises(
        ValueError, match=r"boolean mask of shape \(2,\); a mask selects envs and needs shape \(3,\)"
    ):
        await pool.step(echo_actions(1), env_index=torch.tensor([True, False]))
    await _still_usable(pool)


# -- the loop a pool belongs to ------------------------------------------------------------


def test_a_pool_used_from_another_loop_says_it_belongs_to_its_own(
    executor: str, loop_factory: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    pool = AsyncEnvPool(echo_env_fns(N), executor=executor)
    own = loop_factory()
    try:
        own.run_until_complete(pool.start())
        own.run_until_complete(pool.reset())
        other = loop_factory()
        try:
            for call in (
                lambda: pool.step(echo_actions(N)),
                lambda: pool.async_step_recv(),
                lambda: pool.reset(),
                lambda: pool.call("reset"),
            ):
                with pytest.raises(RuntimeError, match="a pool belongs to the loop it started on"):
                    other.run_until_complete(call())
        finally:
            other.close()
        out = own.run_until_complete(pool.step(echo_actions(N)))  # nothing was dispatched meanwhile
        assert out["next", "observation"][:, 2].tolist() == [1.0] * N
    finally:
        own.run_until_complete(pool.aclose())
        own.close()


def test_a_pool_whose_loop_is_gone_says_so_and_closes_from_another(
    executor: str, loop_factory: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    pool = AsyncEnvPool(echo_env_fns(N), executor=executor)
    own = loop_factory()
    own.run_until_complete(pool.start())
    own.run_until_complete(pool.reset())
    own.close()  # as asyncio.run does when its main() returns with the pool still open
    other = loop_factory()
    try:
        with pytest.raises(RuntimeError, match=r"another event loop \(.*closed\)"):
            other.run_until_complete(pool.step(echo_actions(N)))
        other.run_until_complete(pool.aclose())  # kills what the pool started (checked after the test)
        assert pool.is_closed
    finally:
        other.close()


# -- rewards ---------------------------------------------------------------------------------


class RewardGymEnv(gym.Env):
    """A gymnasium env whose every step returns ``reward``."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, reward: Any) -> None:
        self.reward = reward

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        return np.zeros(2, np.float32), {}

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        return np.zeros(2, np.float32), self.reward, False, False, {}


class RewardNativeEnv(Env):
    """A native env whose every step returns ``reward`` (as a plain dict, or as a TensorDict)."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, reward: Any, as_dict: bool) -> None:
        self.reward = reward
        self.as_dict = as_dict

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> TensorDictBase:
        return TensorDict(observation=torch.zeros(2))

    def step(self, td: TensorDictBase) -> Any:
        if self.as_dict:
            return {"observation": np.zeros(2, np.float32), "reward": self.reward, "terminated": False}
        return TensorDict(observation=torch.zeros(2), reward=self.reward, terminated=torch.tensor(False))


REWARD_ENVS: dict[str, Callable[[Any], Any]] = {
    "gym": RewardGymEnv,
    "native-dict": lambda reward: RewardNativeEnv(reward, as_dict=True),
    "native-td": lambda reward: RewardNativeEnv(torch.as_tensor(reward, dtype=torch.float64), as_dict=False),
}


def _env_fns(kind: str, rewards: list[Any]) -> list[Callable[[], Any]]:
    make = REWARD_ENVS[kind]
    return [lambda reward=reward: make(reward) for reward in rewards]


def _discrete_actions(n: int) -> TensorDict:
    return TensorDict(action=torch.zeros(n, dtype=torch.long), batch_size=[n])


@pytest.mark.parametrize("kind", list(REWARD_ENVS))
async def test_a_reward_beyond_float32_is_its_envs_error(make_pool, kind: str) -> None:
    pool = await make_pool(_env_fns(kind, [0.5, 1e300, 2.0]))
    await pool.reset()
    await pool.async_step_send(_discrete_actions(3))
    with pytest.raises(EnvError, match="reward of 1e\\+300, beyond float32's range") as info:
        await pool.async_step_recv(min_get=3)
    assert info.value.env_index == 1
    out = await pool.async_step_recv(min_get=2)
    assert out["next", "reward"].flatten().tolist() == [0.5, 2.0]


@pytest.mark.parametrize("kind", list(REWARD_ENVS))
async def test_a_reward_of_one_element_is_read_and_others_name_the_reward(make_pool, kind: str) -> None:
    pool = await make_pool(_env_fns(kind, [np.array([0.5]), np.array(1.5), np.array([1.0, 2.0])]))
    await pool.reset()
    await pool.async_step_send(_discrete_actions(3))
    with pytest.raises(EnvError, match=r"reward of shape \(2,\): a reward is one number") as info:
        await pool.async_step_recv(min_get=3)
    assert info.value.env_index == 2
    out = await pool.async_step_recv(min_get=2)
    assert out["next", "reward"].flatten().tolist() == [0.5, 1.5]
