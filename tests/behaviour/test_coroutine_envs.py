"""Coroutine envs (``async def step``) run as tasks of their own on every executor.

The inline executor starts a coroutine env's command inside ``submit`` (eagerly, until
it first suspends) and then hands it to the env's task: these check that the env
cannot tell, whatever it does before and after its first await.
"""

from __future__ import annotations

import asyncio

import pytest
from tensordict import TensorDictBase

from aenvs import EnvContext, EnvError
from aenvs.testing import EchoEnv
from tests.helpers import actions


class TaskAwareEnv(EchoEnv):
    """Echoes its action; how it waits depends on the action.

    0: no await at all; 1: ``asyncio.timeout`` set before its first await, expiring
    inside it; 2: ``asyncio.timeout`` set after a first await; 3: raises before any
    await; 4: cancels itself through ``asyncio.current_task()`` and catches it; 5: the
    future it awaits completes and, in the same loop turn, its task is cancelled (the
    cancellation reaches it at that await, as in any task); 6: the future it awaits is
    cancelled by someone else (a CancelledError there, the task itself not cancelled).
    The observation's step counter is replaced by 1 when the env's own task ran the
    step (the timeout or cancellation reached it), else 0.
    """

    async def step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        how = int(td["action"].item())
        task = asyncio.current_task()
        assert task is not None, "a coroutine env's step must run in a task"
        own = 0.0
        if how == 1:
            try:
                async with asyncio.timeout(0.01):
                    await asyncio.sleep(30)
            except TimeoutError:
                own = 1.0
        elif how == 2:
            await asyncio.sleep(0)
            try:
                async with asyncio.timeout(0.01):
                    await asyncio.sleep(30)
            except TimeoutError:
                own = 1.0
        elif how == 3:
            raise RuntimeError(f"env {self.env_index} fails before its first await")
        elif how == 4:
            task.cancel()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                task.uncancel()
                own = 1.0
        elif how in (5, 6):
            loop = asyncio.get_running_loop()
            awaited = loop.create_future()
            if how == 5:
                loop.call_soon(awaited.set_result, None)
                loop.call_soon(task.cancel)
            else:
                loop.call_soon(awaited.cancel)
            try:
                await awaited
            except asyncio.CancelledError:
                if how == 5:
                    assert task.uncancel() == 0
                else:
                    assert task.cancelling() == 0, "only the awaited future was cancelled"
                own = 1.0
        out = self._advance(td)
        out["observation"][2] = own
        return out


def task_aware_env_fns(n: int) -> list:
    def make(ctx: EnvContext) -> TaskAwareEnv:
        return TaskAwareEnv(env_index=ctx.env_index)

    return [make] * n


@pytest.mark.parametrize("how", [0, 1, 2, 4, 5, 6])
async def test_a_coroutine_env_waits_in_its_own_task(make_pool, how: int) -> None:
    pool = await make_pool(task_aware_env_fns(3))
    await pool.reset()
    caller = asyncio.current_task()
    assert caller is not None
    for _ in range(2):  # the first command of an env, and a later one
        await pool.async_step_send(actions([float(how)] * 3))
        assert not caller.cancelling(), "the env's timeout or cancel reached the sender"
        # well before the envs' 30 s sleeps end: a timeout or cancellation reached them at once
        out = await pool.async_step_recv(min_get=3, timeout=10)
        assert out["env_index"].tolist() == [0, 1, 2]
        assert out["next", "observation"][:, 1].tolist() == [float(how)] * 3
        ran_in_own_task = out["next", "observation"][:, 2].tolist()
        assert ran_in_own_task == ([1.0] * 3 if how else [0.0] * 3)
    assert not caller.cancelling()


async def test_an_env_failing_before_its_first_await_answers_once(make_pool) -> None:
    pool = await make_pool(task_aware_env_fns(3))
    await pool.reset()
    td = actions([0.0, 3.0, 0.0])
    await pool.async_step_send(td)
    with pytest.raises(EnvError) as info:
        await pool.async_step_recv(min_get=3)
    assert info.value.env_index == 1 and "fails before its first await" in str(info.value)
    out = await pool.async_step_recv(min_get=2)  # the others' results were kept
    assert out["env_index"].tolist() == [0, 2]
    assert pool.stats().in_flight == 0 and pool.stats().ready == 0
    await pool.reset(env_index=[1])
    await pool.async_step_send(actions([2.0], env_index=[1]))
    out = await pool.async_step_recv(min_get=1)
    assert out["next", "observation"][:, 2].tolist() == [1.0]
