"""Env failures surface as EnvError for that env only; bad input is rejected before dispatch."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tensordict import TensorDict, lazy_stack

from aenvs import AenvsError, EnvBusyError, EnvError, EnvState
from aenvs.testing import echo_env_fns
from tests.faults.support import WAIT
from tests.helpers import Gate, actions, gated_env_fns


async def _still_usable(pool, n: int) -> None:
    """A full step round on every env works and echoes its own action."""
    if pool.env_states != [EnvState.RUN] * n:
        await pool.reset()
    await pool.async_step_send(actions([float(i + 1) for i in range(n)]))
    out = await pool.async_step_recv(min_get=n)
    assert out["next", "observation"][:, 1].tolist() == [float(i + 1) for i in range(n)]
    assert out["next", "observation"][:, 0].tolist() == [float(i) for i in range(n)]


async def test_env_exception_is_env_error_and_others_are_unaffected(make_pool) -> None:
    pool = await make_pool(echo_env_fns(3))
    await pool.reset()
    await pool.async_step_send(actions([1, -1, 3]))
    with pytest.raises(EnvError) as info:
        await pool.async_step_recv(min_get=3)
    err = info.value
    assert isinstance(err, AenvsError)
    assert (err.env_index, err.command) == (1, "step")
    assert "got the negative action" in err.remote_traceback
    assert "Traceback" in err.remote_traceback and err.exc_type == "builtins.ValueError"
    assert "env 1 failed in step" in str(err)
    assert pool.env_states[1] is EnvState.ERROR
    out = await pool.async_step_recv(min_get=2)  # the others were kept, not lost
    assert out["env_index"].tolist() == [0, 2]
    assert pool.stats().errors == [0, 1, 0]
    await pool.reset()
    await _still_usable(pool, 3)


async def test_an_env_error_is_raised_while_the_others_of_the_receive_still_step(
    make_pool, executor: str, tmp_path
) -> None:
    gate = Gate(str(tmp_path))
    one_each = {} if executor == "inline" else {"envs_per_worker": 1}  # env 0 answers alone
    pool = await make_pool(gated_env_fns(3, gate, fail_at_once=True), **one_each)
    await pool.reset()
    await pool.async_step_send(actions([-1, 1, 1]))
    try:
        with pytest.raises(EnvError) as info:  # envs 1 and 2 wait for the gate meanwhile
            async with asyncio.timeout(WAIT):
                await pool.async_step_recv(min_get=3)
        assert (info.value.env_index, info.value.command) == (0, "step")
    finally:
        gate.open()
    async with asyncio.timeout(WAIT):
        out = await pool.async_step_recv(min_get=2)
    assert out["env_index"].tolist() == [1, 2]


async def test_env_error_in_step_and_maybe_reset_and_whole_batch_step(make_pool) -> None:
    pool = await make_pool(echo_env_fns(2))
    td = await pool.reset()
    td["action"] = torch.tensor([[1.0], [-1.0]], dtype=torch.float64)
    with pytest.raises(EnvError) as info:
        await pool.step_and_maybe_reset(td)
    assert info.value.env_index == 1 and info.value.command == "step_and_maybe_reset"
    out, _ = await pool.async_step_and_maybe_reset_recv()
    assert out["env_index"].tolist() == [0]
    await _still_usable(pool, 2)


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (lambda: actions([1, 1], env_index=[0, 5]), IndexError, "env index 5 is out of range"),
        (lambda: actions([1, 1], env_index=[1, 1]), ValueError, "env index 1 appears more than once"),
        (lambda: actions([1, 1]), ValueError, "batch size"),
        (
            lambda: TensorDict(action=torch.ones(3, 2, dtype=torch.float64), batch_size=[3]),
            ValueError,
            r"env 0 \(and 2 more\): 'action' has shape \(2,\)",
        ),
        (
            lambda: TensorDict(action=torch.ones(3, 1), batch_size=[3]),
            ValueError,
            "'action' has dtype torch.float32, expected torch.float64",
        ),
        (lambda: TensorDict(act=torch.ones(3, 1), batch_size=[3]), ValueError, "no 'action' entry"),
        (lambda: {"action": torch.ones(3, 1)}, TypeError, "expected a TensorDict"),
    ],
    ids=["unknown-index", "duplicate-index", "batch-mismatch", "shape", "dtype", "missing-key", "not-a-td"],
)
async def test_bad_step_input_is_rejected_before_dispatch(make_pool, bad, error, match) -> None:
    pool = await make_pool(echo_env_fns(3))
    await pool.reset()
    with pytest.raises(error, match=match):
        await pool.async_step_send(bad())
    assert pool.stats().in_flight == 0  # nothing was dispatched
    await _still_usable(pool, 3)


async def test_bad_action_names_the_env_in_a_lazy_pool(make_pool) -> None:
    pool = await make_pool(["CartPole-v1", "Pendulum-v1"], stack="lazy")
    await pool.reset()
    td = lazy_stack(
        [TensorDict(action=torch.tensor(1)), TensorDict(action=torch.tensor([0.5, 0.5]))]
    )  # Pendulum wants shape (1,)
    with pytest.raises(ValueError, match=r"env 1: 'action' has shape \(2,\) per env, expected \(1,\)"):
        await pool.async_step_send(td)
    assert pool.stats().in_flight == 0


async def test_double_send_is_env_busy_and_pool_stays_usable(make_pool) -> None:
    pool = await make_pool(echo_env_fns(2))
    await pool.reset()
    await pool.async_step_send(actions([1, 1]))
    with pytest.raises(EnvBusyError, match="env 0"):
        await pool.async_step_send(actions([1, 1]))
    with pytest.raises(EnvBusyError):
        await pool.reset(env_index=[1])
    with pytest.raises(EnvBusyError):
        await pool.get_attr("steps")
    await pool.async_step_recv(min_get=2)
    await _still_usable(pool, 2)


async def test_error_in_reset_is_env_error(make_pool) -> None:
    def make() -> object:
        import gymnasium as gym

        class BadReset(gym.Env):
            observation_space = gym.spaces.Box(-1, 1, (1,))
            action_space = gym.spaces.Discrete(2)

            def reset(self, *, seed=None, options=None):
                raise OSError("simulator did not answer")

        return BadReset()

    pool = await make_pool([make, *echo_env_fns(1)], stack="lazy")
    with pytest.raises(EnvError, match="simulator did not answer") as info:
        await pool.reset()
    assert info.value.command == "reset" and info.value.env_index == 0
    out = await pool.async_reset_recv()
    assert out["env_index"].tolist() == [1]


async def test_wrong_observation_shape_from_an_env_is_its_error_only(make_pool) -> None:
    def make() -> object:
        import gymnasium as gym
        import numpy as np

        class Liar(gym.Env):
            observation_space = gym.spaces.Box(-1, 1, (3,), np.float32)
            action_space = gym.spaces.Discrete(2)

            def reset(self, *, seed=None, options=None):
                return np.zeros(3, np.float32), {}

            def step(self, action):
                return np.zeros(2, np.float32), 0.0, False, False, {}

        return Liar()

    pool = await make_pool([make, make])
    td = await pool.reset()
    td["action"] = torch.tensor([0, 1])
    await pool.async_step_send(td, env_index=[0, 1])
    with pytest.raises(EnvError, match=r"'observation' with shape \(2,\), but its space says \(3,\)"):
        await pool.async_step_recv(min_get=2)


async def test_call_errors_name_the_method(make_pool) -> None:
    pool = await make_pool(echo_env_fns(2))
    with pytest.raises(EnvError) as info:
        await pool.call("no_such_method")
    assert info.value.command == "call:no_such_method"
    assert await pool.get_attr("env_index") == [0, 1]


async def test_envs_failing_to_build_raise_once_and_log_nothing(make_pool, caplog) -> None:
    """Several envs that cannot be made: one EnvError for the first, and no failure is left
    unretrieved for asyncio to log later from a finalizer (at a moment the GC picks)."""
    import gc

    with pytest.raises(EnvError, match="NoSuchEnv") as raised:
        await make_pool(["NoSuchEnv-v0"] * 4)
    assert raised.value.env_index == 0 and raised.value.command == "make"
    del raised
    gc.collect()
    assert "never retrieved" not in caplog.text
