"""An env raising KeyboardInterrupt, SystemExit or GeneratorExit inside its step.

The env that raised gets one answer, an EnvError; the other envs' results arrive; the
worker hosting it lives on; the caller's task is never cancelled. On the inline executor
a KeyboardInterrupt (most likely the user's Ctrl-C landing in env code) is also raised
once to the caller, by the receive that collects next, before it takes anything.
"""

from __future__ import annotations

import asyncio

import pytest

from aenvs import EnvCrashedError, EnvError
from aenvs.testing import Fault, FaultKind, faulty_env_fns
from tests.faults.support import WAIT, collect, echo_actions

INTERRUPTS: dict[FaultKind, str] = {
    "keyboard_interrupt": "KeyboardInterrupt",
    "system_exit": "SystemExit",
    "generator_exit": "GeneratorExit",
}


@pytest.mark.parametrize("asynchronous", [False, True], ids=["plain", "coroutine"])
@pytest.mark.parametrize("kind", list(INTERRUPTS))
async def test_an_interrupt_inside_an_env_is_its_error_alone(
    make_pool, executor: str, kind: FaultKind, asynchronous: bool
) -> None:
    n = 4
    pool = await make_pool(
        faulty_env_fns(n, {1: Fault(kind, at=1)}, asynchronous=asynchronous), envs_per_worker=2
    )
    caller = asyncio.current_task()
    assert caller is not None
    await pool.reset()
    await pool.async_step_send(echo_actions(n))
    interrupts = 0
    if executor == "inline" and kind == "keyboard_interrupt":
        with pytest.raises(KeyboardInterrupt, match="env 1"):
            async with asyncio.timeout(WAIT):
                await pool.async_step_recv(min_get=n)
        interrupts += 1
    results, errors = await collect(pool, n)
    assert interrupts == (1 if executor == "inline" and kind == "keyboard_interrupt" else 0)
    assert [e.env_index for e in errors] == [1], errors
    assert not isinstance(errors[0], EnvCrashedError), "the worker hosting the env must not die of it"
    assert INTERRUPTS[kind] in errors[0].exc_type and "env 1: injected fault at step 1" in str(errors[0])
    assert results["env_index"].tolist() == [0, 2, 3]
    assert results["next", "observation"][:, 2].tolist() == [1.0, 1.0, 1.0]
    stats = pool.stats()
    assert stats.in_flight == 0 and stats.ready == 0, "an answer was duplicated or is still due"
    assert not caller.cancelling(), "the pool cancelled its caller's task"
    # nothing is left over: the failed env resets, and every env steps again
    await pool.reset(env_index=[1])
    out = await pool.step(echo_actions(n))
    assert out["env_index"].tolist() == [0, 1, 2, 3]
    assert out["next", "observation"][:, 2].tolist() == [2.0, 1.0, 2.0, 2.0]
    assert not caller.cancelling()


async def test_an_interrupt_in_a_whole_batch_step_leaves_the_pool_usable(make_pool, executor: str) -> None:
    """A whole-batch step through an env raising KeyboardInterrupt: one EnvError (or, on the
    inline executor, the interrupt once), and the next calls find every env free."""
    n = 3
    pool = await make_pool(faulty_env_fns(n, {0: Fault("keyboard_interrupt", at=1)}))
    caller = asyncio.current_task()
    assert caller is not None
    await pool.reset()
    expected = KeyboardInterrupt if executor == "inline" else EnvError
    with pytest.raises(expected):
        async with asyncio.timeout(WAIT):
            await pool.step(echo_actions(n))
    assert not caller.cancelling()
    async with asyncio.timeout(WAIT):
        await pool.reset()
        out = await pool.step(echo_actions(n))
    assert out["next", "observation"][:, 2].tolist() == [1.0, 1.0, 1.0]
    stats = pool.stats()
    assert stats.in_flight == 0 and stats.ready == 0
    assert not caller.cancelling()
