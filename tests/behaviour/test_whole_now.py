"""A whole-batch step run where it is sent (``step_columns_now``; ``step`` and
``step_and_maybe_reset`` on the inline executor): the results of the usual send and
receive, nothing sent where it cannot run so, an env's error raised as a receive raises it."""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict

from aenvs import AsyncEnvPool, EnvError
from tests.conftest import PoolFactory

N = 3


class CountingEnv(gym.Env[np.ndarray, np.int64]):
    """Observes ``[t, action, index]``; gives an info entry on its step ``info_at`` and
    raises on its step ``fail_at`` (steps counted over its lifetime); ends every 4 steps."""

    observation_space = spaces.Box(-100.0, 100.0, (3,), np.float32)
    action_space = spaces.Discrete(3)

    def __init__(self, index: int, info_at: int = 0, fail_at: int = 0, interrupt_at: int = 0) -> None:
        self.index, self.info_at, self.fail_at, self.interrupt_at = index, info_at, fail_at, interrupt_at
        self.t = self.steps = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        self.t = 0
        return np.array([0, 0, self.index], np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.steps += 1
        self.t += 1
        if self.steps == self.fail_at:
            raise RuntimeError(f"boom in env {self.index}")
        if self.steps == self.interrupt_at:
            raise KeyboardInterrupt(f"Ctrl-C in env {self.index}")
        info = {"seen": self.steps} if self.steps == self.info_at else {}
        obs = np.array([self.t, int(action), self.index], np.float32)
        return obs, float(self.index + int(action)), self.t % 4 == 0, False, info


def env_fns(**per_env: dict[int, int]) -> list[Any]:
    return [
        functools.partial(CountingEnv, i, **{k: v[i] for k, v in per_env.items() if i in v}) for i in range(N)
    ]


def assert_same_columns(got: dict[Any, Any], expected: dict[Any, Any]) -> None:
    assert got.keys() == expected.keys()
    for key, column in got.items():
        if isinstance(column, np.ndarray):
            np.testing.assert_array_equal(column, expected[key], err_msg=str(key))
        else:
            assert list(column) == list(expected[key]), key


async def usual_step(pool: AsyncEnvPool, actions: dict[str, torch.Tensor]) -> dict[Any, Any]:
    await pool.async_step_send_columns(list(range(N)), actions)
    return await pool.async_step_recv_columns(min_get=None, env_index=list(range(N)), timeout=30)


async def test_step_columns_now_gives_what_a_send_and_receive_give(
    make_pool: PoolFactory, executor: str
) -> None:
    now, usual = await make_pool(env_fns(info_at={1: 3})), await make_pool(env_fns(info_at={1: 3}))
    await now.reset()
    await usual.reset()
    info_seen = False
    for t in range(8):  # episode ends, and env 1's info entry at its third step
        actions = {"action": torch.tensor([(t + i) % 3 for i in range(N)])}
        expected = await usual_step(usual, actions)
        got = now.step_columns_now({"action": actions["action"].clone()})
        if executor == "inline":
            assert got is not None
        else:  # runs only where it is sent on the inline executor: nothing sent elsewhere
            assert got is None
            assert now.stats().in_flight == 0
            got = await usual_step(now, actions)
        assert_same_columns(got, expected)
        info_seen = info_seen or any(key[0] == "info" for key in got)
    assert info_seen  # a batch that was not answered plainly went through too
    assert now.stats().steps == usual.stats().steps == [8] * N
    assert now.env_states == usual.env_states


async def test_an_env_error_leaves_the_other_results_to_receive(
    make_pool: PoolFactory, executor: str
) -> None:
    pool = await make_pool(env_fns(fail_at={1: 2}))
    await pool.reset()
    actions = {"action": torch.tensor([1, 1, 1])}
    if executor != "inline":  # nothing run where it is sent: the usual calls raise the same
        assert pool.step_columns_now(actions) is None
        await usual_step(pool, actions)
        with pytest.raises(EnvError, match="boom in env 1") as caught:
            await usual_step(pool, actions)
    else:
        assert pool.step_columns_now(actions) is not None
        with pytest.raises(EnvError, match="boom in env 1") as caught:
            pool.step_columns_now(actions)
    assert caught.value.env_index == 1
    others = await pool.async_step_recv_columns(min_get=2, timeout=30)
    assert sorted(others[("env_index",)].tolist()) == [0, 2]
    assert pool.stats().in_flight == 0 and pool.stats().ready == 0
    assert (await pool.reset()).batch_size == torch.Size([N])  # every env free again


async def test_an_interrupt_in_an_env_leaves_the_results_to_receive(
    make_pool: PoolFactory, executor: str
) -> None:
    """An env raising KeyboardInterrupt in a step run where it was sent: the interrupt reaches
    the caller once (as a receive's would), the env's result is its EnvError, the other
    envs' results are received as after a send, and the pool steps on."""
    pool = await make_pool(env_fns(interrupt_at={1: 1}))
    await pool.reset()
    actions = {"action": torch.tensor([1, 1, 1])}
    if executor == "inline":
        with pytest.raises(KeyboardInterrupt, match="env 1"):
            pool.step_columns_now(actions)
    else:  # not run where it is sent: nothing sent; sent the usual way
        assert pool.step_columns_now(actions) is None
        assert pool.stats().in_flight == 0
        await pool.async_step_send_columns(list(range(N)), actions)
    with pytest.raises(EnvError, match="Ctrl-C in env 1"):
        await pool.async_step_recv_columns(min_get=None, env_index=[1], timeout=30)
    others = await pool.async_step_recv_columns(min_get=2, timeout=30)
    assert sorted(others[("env_index",)].tolist()) == [0, 2]
    await pool.reset()
    out = await pool.step(TensorDict({"action": torch.tensor([2, 2, 2])}, [N]))
    assert out["next", "observation"][:, 1].tolist() == [2.0, 2.0, 2.0]
    assert pool.stats().in_flight == 0 and pool.stats().ready == 0


async def test_nothing_is_sent_where_it_cannot_run_at_once(make_pool: PoolFactory) -> None:
    pool = await make_pool(env_fns())
    await pool.reset()
    wrong_dtype = {"action": torch.tensor([1.0, 0.0, 1.0])}
    assert pool.step_columns_now(wrong_dtype) is None
    assert pool.stats().in_flight == 0
    with pytest.raises(ValueError, match=r"env 0.*'action'.*dtype"):  # the usual send names what is wrong
        await pool.async_step_send_columns(list(range(N)), wrong_dtype)
    assert pool.step_columns_now({"action": torch.tensor([1, 0])}) is None  # a row short
    assert pool.step_columns_now({"action": torch.tensor([1, 0, 1]), "extra": torch.zeros(N)}) is None
    await pool.async_step_send_columns([0], {"action": torch.tensor([2])})  # env 0 busy
    assert pool.step_columns_now({"action": torch.tensor([1, 0, 1])}) is None
    assert pool.stats().in_flight in (0, 1)  # env 0's step, maybe already answered
    columns = await pool.async_step_recv_columns(min_get=None, env_index=[0], timeout=30)
    assert columns[("observation",)][0].tolist() == [1.0, 2.0, 0.0]


async def test_a_step_timeout_keeps_the_usual_path(make_pool: PoolFactory) -> None:
    pool = await make_pool(env_fns(), step_timeout=30)
    await pool.reset()
    assert pool.step_columns_now({"action": torch.tensor([1, 0, 1])}) is None
    assert pool.stats().in_flight == 0
    out, _ = await pool.step_and_maybe_reset((await pool.reset()).set("action", torch.tensor([1, 0, 1])))
    assert out["next", "observation"][:, 1].tolist() == [1.0, 0.0, 1.0]
