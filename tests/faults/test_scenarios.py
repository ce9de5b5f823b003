"""Fault scenarios, each on every executor it applies to, checking the five invariants:

I1 every accepted send yields exactly one result or one error for that env and step;
I2 every error names the env index, the command and the executor, with the original traceback;
I3 a fault in one env neither loses nor delays the other envs' results;
I4 every blocking call has a bound (here: every wait is bounded by WAIT, so a hang fails);
I5 nothing of ours is left behind (the autouse leak guard of tests/conftest.py).

Envs that share a worker share its fate (a process hosting envs 0 and 1 answers for both
at once), so scenarios that check I3 give each env its own worker.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from aenvs import AsyncEnvPool, EnvCrashedError, EnvError, EnvState, EnvTimeoutError
from aenvs.testing import Fault, faulty_env_fns
from tests.faults.support import WAIT, applies_to, collect, echo_actions

pytestmark = pytest.mark.timeout(90)


def _check_results(out: Any, envs: list[int], step: int) -> None:
    """I1: exactly these envs, each echoing its own index and the step it took."""
    assert out["env_index"].tolist() == envs
    assert out["next", "observation"][:, 0].tolist() == [float(i) for i in envs]
    assert out["next", "observation"][:, 2].tolist() == [float(step)] * len(envs)


def _check_error(error: EnvError, env: int, command: str, executor: str, needle: str) -> None:
    """I2: the env, the command, the executor and the original traceback are all there."""
    assert error.env_index == env
    assert error.command == command
    assert error.executor == executor
    assert f"env {env}" in str(error) and executor in str(error)
    assert needle in error.remote_traceback


# -- construction ------------------------------------------------------------------------


async def test_constructor_raises(executor: str) -> None:
    with pytest.raises(EnvError) as info:
        async with asyncio.timeout(WAIT):
            await AsyncEnvPool(
                faulty_env_fns(3, {1: Fault("raise", where="init")}), executor=executor
            ).start()
    _check_error(info.value, 1, "make", executor, "InjectedFault")


@applies_to("thread", "process", "ray")  # inline builds envs on the loop: a hang there is the caller's
async def test_constructor_hang_is_bounded_by_startup_timeout(executor: str, tmp_path: Path) -> None:
    release = tmp_path / "release"
    fns = faulty_env_fns(2, {1: Fault("hang", where="init", release=str(release))})
    pool = AsyncEnvPool(fns, executor=executor, envs_per_worker=1, startup_timeout=0.5, close_timeout=0.5)
    try:
        with pytest.raises(EnvTimeoutError) as info:
            async with asyncio.timeout(WAIT):
                await pool.start()
        assert info.value.env_index == 1 and info.value.command == "make"
        assert "startup_timeout" in str(info.value) and executor in str(info.value)
        assert pool.is_closed
    finally:
        release.touch()  # a thread stuck in the constructor can finish now


# -- exceptions in steps -----------------------------------------------------------------


@pytest.mark.parametrize("on_error", ["raise", "restart"])
async def test_step_raises_once(make_pool, executor: str, on_error: str) -> None:
    pool = await make_pool(
        faulty_env_fns(4, {2: Fault("raise", at=2)}), envs_per_worker=1, on_error=on_error, restart_backoff=0
    )
    td = await pool.reset()
    _check_results(await pool.step(echo_actions(4)), [0, 1, 2, 3], 1)
    await pool.async_step_send(echo_actions(4))
    results, errors = await collect(pool, 4)
    _check_results(results, [0, 1, 3], 2)  # I3: the others are delivered
    assert [e.env_index for e in errors] == [2]
    _check_error(errors[0], 2, "step", executor, "InjectedFault: env 2: injected fault at step 2")
    # the failed env is usable again after a reset; with "restart" it is a new instance
    td = await pool.reset(env_index=[2])
    assert td["env_index"].tolist() == [2]
    assert (await pool.get_attr("reset_count", env_index=[2])) == [1 if on_error == "restart" else 2]
    assert pool.stats().restarts == [0, 0, 1 if on_error == "restart" else 0, 0]
    _check_results(await pool.step(echo_actions(1, env_index=[2])), [2], 1)
    assert (await pool.get_attr("step_count", env_index=[2])) == [1 if on_error == "restart" else 3]


async def test_step_raising_always_exhausts_the_restart_budget(make_pool, executor: str) -> None:
    pool = await make_pool(
        faulty_env_fns(2, {1: Fault("raise", at=1, always=True)}),
        envs_per_worker=1,
        on_error="restart",
        max_restarts=2,
        restart_backoff=0,
    )
    for _ in range(3):  # the first failure and one after each of the two restarts
        await pool.reset()
        with pytest.raises(EnvError) as info:
            await pool.step(echo_actions(2))
        assert info.value.env_index == 1
    await pool.reset(env_index=[0])  # waits for nothing: env 0 never failed
    with pytest.raises(EnvError, match="max_restarts"):
        await pool.reset(env_index=[1])
    assert pool.stats().in_flight == 0  # rejected before anything was dispatched
    assert pool.env_states[1] is EnvState.ERROR
    assert pool.stats().restarts == [0, 2]
    _check_results(await pool.step(echo_actions(1, env_index=[0])), [0], 1)  # I3


async def test_unpicklable_exception_still_reaches_the_caller(make_pool, executor: str) -> None:
    pool = await make_pool(faulty_env_fns(3, {0: Fault("unpicklable", at=1)}), envs_per_worker=1)
    await pool.reset()
    await pool.async_step_send(echo_actions(3))
    results, errors = await collect(pool, 3)
    _check_results(results, [1, 2], 1)
    assert [e.env_index for e in errors] == [0]
    _check_error(errors[0], 0, "step", executor, "UnpicklableError")
    assert "UnrebuildableError" in errors[0].remote_traceback  # its cause travels too


async def test_wrong_shape_and_nan_fail_only_their_env(make_pool, executor: str) -> None:
    faults = {1: Fault("bad_shape", at=1), 2: Fault("nan", at=1)}
    pool = await make_pool(faulty_env_fns(4, faults), envs_per_worker=1, check_finite=True)
    await pool.reset()
    await pool.async_step_send(echo_actions(4))
    results, errors = await collect(pool, 4)
    _check_results(results, [0, 3], 1)
    assert sorted(e.env_index for e in errors) == [1, 2]
    by_env = {e.env_index: e for e in errors}
    assert "'observation' with shape (5,)" in str(by_env[1])
    assert "NaN or inf in 'observation'" in str(by_env[2])


# -- hangs -------------------------------------------------------------------------------


async def test_late_result_after_a_recv_timeout_is_delivered_once(make_pool, executor: str, tmp_path) -> None:
    release = tmp_path / "release"
    fns = faulty_env_fns(3, {1: Fault("hang", at=1, release=str(release))}, asynchronous=executor == "inline")
    pool = await make_pool(fns, envs_per_worker=1)
    await pool.reset()
    await pool.async_step_send(echo_actions(3))
    out = await pool.async_step_recv(min_get=2, timeout=WAIT)
    _check_results(out, [0, 2], 1)  # I3: not held back by the hung env
    with pytest.raises(TimeoutError):
        await pool.async_step_recv(min_get=1, timeout=0.2)
    release.touch()
    late = await pool.async_step_recv(min_get=1, timeout=WAIT)
    _check_results(late, [1], 1)
    with pytest.raises(ValueError, match="would wait forever"):  # nothing duplicated, nothing pending
        await pool.async_step_recv(min_get=1)


@pytest.mark.parametrize("on_error", ["raise", "restart"])
async def test_step_hang_is_bounded_by_step_timeout(
    make_pool, executor: str, on_error: str, tmp_path
) -> None:
    release = tmp_path / "release"
    fns = faulty_env_fns(3, {1: Fault("hang", at=2, release=str(release))}, asynchronous=executor == "inline")
    pool = await make_pool(fns, envs_per_worker=1, step_timeout=0.5, on_error=on_error, restart_backoff=0)
    try:
        await pool.reset()
        _check_results(await pool.step(echo_actions(3)), [0, 1, 2], 1)
        await pool.async_step_send(echo_actions(3))
        results, errors = await collect(pool, 3)
        _check_results(results, [0, 2], 2)
        assert [type(e) for e in errors] == [EnvTimeoutError]
        _check_error(errors[0], 1, "step", executor, "did not finish its step within 0.5 s")
        assert pool.stats().timeouts == [0, 1, 0]
        if on_error == "restart":  # the worker was replaced; the env steps again after a reset
            await pool.reset()
            _check_results(await pool.step(echo_actions(3)), [0, 1, 2], 1)
            assert pool.stats().restarts == [0, 1, 0]
        else:  # its worker was stopped: the env answers with a crash until the pool is closed
            with pytest.raises(EnvCrashedError):
                await pool.reset(env_index=[1])
            _check_results(await pool.step(echo_actions(2, env_index=[0, 2])), [0, 2], 3)
        if executor == "thread":
            assert pool.stats().abandoned_threads == 1
    finally:
        release.touch()  # an abandoned thread can end now


# -- dead workers ------------------------------------------------------------------------


@applies_to("process", "ray")  # a thread or the loop cannot die alone
@pytest.mark.parametrize("kind", ["sigkill", "exit"])
@pytest.mark.parametrize("on_error", ["raise", "restart"])
async def test_worker_dies_mid_step(make_pool, executor: str, kind: str, on_error: str) -> None:
    pool = await make_pool(
        faulty_env_fns(3, {1: Fault(kind, at=2)}),  # type: ignore[arg-type]
        envs_per_worker=1,
        on_error=on_error,
        restart_backoff=0,
    )
    await pool.reset()
    await pool.step(echo_actions(3))
    await pool.async_step_send(echo_actions(3))
    results, errors = await collect(pool, 3)
    _check_results(results, [0, 2], 2)
    assert [type(e) for e in errors] == [EnvCrashedError]
    _check_error(errors[0], 1, "step", executor, "died")
    if on_error == "restart":
        await pool.reset()
        _check_results(await pool.step(echo_actions(3)), [0, 1, 2], 1)
        assert pool.stats().restarts == [0, 1, 0]
    else:
        with pytest.raises(EnvCrashedError):
            await pool.reset(env_index=[1])


@applies_to("process", "ray")
@pytest.mark.parametrize("on_error", ["raise", "restart"])
async def test_worker_killed_while_idle(make_pool, executor: str, on_error: str) -> None:
    import psutil

    pool = await make_pool(faulty_env_fns(2, {}), envs_per_worker=1, on_error=on_error, restart_backoff=0)
    await pool.reset()
    victim = psutil.Process(pool.executor.pids[1])  # pyright: ignore[reportAttributeAccessIssue]
    victim.kill()
    victim.wait(timeout=WAIT)
    await pool.async_step_send(echo_actions(2))
    results, errors = await collect(pool, 2)
    _check_results(results, [0], 1)
    assert [(type(e), e.env_index) for e in errors] == [(EnvCrashedError, 1)]
    if on_error == "restart":
        await pool.reset()
        _check_results(await pool.step(echo_actions(2)), [0, 1], 1)


# not ray: ray.kill involves no SIGTERM, and env code in a Ray actor runs off the main thread,
# where Python cannot install a signal handler (tests/executors/test_ray.py closes hung actors)
@applies_to("process")
async def test_worker_ignoring_sigterm_is_killed_within_close_timeout(executor: str, tmp_path) -> None:
    import psutil

    release = tmp_path / "never"  # the step hangs for good, in a worker that ignores SIGTERM
    fns = faulty_env_fns(2, {0: Fault("hang", at=1, release=str(release))}, ignore_sigterm=[0])
    pool = AsyncEnvPool(fns, executor=executor, envs_per_worker=1, close_timeout=0.3)
    await pool.start()
    await pool.reset()
    pids = list(pool.executor.pids)  # pyright: ignore[reportAttributeAccessIssue]
    await pool.async_step_send(echo_actions(2))
    async with asyncio.timeout(WAIT):  # I4: 0.3 s for the stop message, 1 s for SIGTERM, then SIGKILL
        await pool.aclose()
    _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], timeout=WAIT)
    assert not alive


def cancellation_swallowing_env_fns(n: int, swallow_for: float) -> list[Any]:
    """Coroutine echo envs whose step swallows every cancellation for ``swallow_for`` seconds
    after it starts (an env that must not hold up a close), then ends."""

    def make(ctx: Any) -> Any:
        import asyncio
        import time

        from aenvs.testing import AsyncEchoEnv

        class Stubborn(AsyncEchoEnv):
            async def step(self, td: Any) -> Any:  # type: ignore[override]
                until = time.monotonic() + swallow_for
                while time.monotonic() < until:
                    try:
                        await asyncio.sleep(0.02)
                    except asyncio.CancelledError:
                        pass
                return self._advance(td)

        return Stubborn(env_index=ctx.env_index)

    return [make] * n


@applies_to("inline", "thread", "process", "ray")
async def test_an_env_swallowing_its_cancellation_does_not_hold_up_close(executor: str) -> None:
    pool = AsyncEnvPool(cancellation_swallowing_env_fns(2, 4.0), executor=executor, close_timeout=0.3)
    await pool.start()
    await pool.reset()
    await pool.async_step_send(echo_actions(2))
    with pytest.raises(TimeoutError):  # the steps are under way, in the envs' own hands
        await pool.async_step_recv(min_get=1, timeout=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(WAIT):  # I4
        await pool.aclose()
    assert loop.time() - started < 3.0, "close waited for the envs instead of close_timeout"
    assert pool.is_closed
    # what was abandoned ends by itself (the envs stop swallowing after 4 s): nothing to leak
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    if others:
        await asyncio.wait(others, timeout=WAIT)


# -- bad input ---------------------------------------------------------------------------


async def test_every_bad_input_is_rejected_before_dispatch(make_pool, executor: str) -> None:
    pool = await make_pool(faulty_env_fns(3, {}))
    await pool.reset()
    wrong_dtype = TensorDict(action=torch.ones(3, 1, dtype=torch.float32), batch_size=[3])
    bad_inputs: list[tuple[Any, type[Exception], str]] = [
        (lambda: pool.async_step_send(echo_actions(3, shape=(3, 2))), ValueError, "'action' has shape"),
        (lambda: pool.async_step_send(wrong_dtype), ValueError, "'action' has dtype"),
        (lambda: pool.async_step_send(echo_actions(2)), ValueError, "batch size"),
        (lambda: pool.async_step_send(echo_actions(1, env_index=[7])), IndexError, "env index 7"),
        (lambda: pool.async_step_send(echo_actions(2, env_index=[1, 1])), ValueError, "env index 1 appears"),
        (lambda: pool.async_step_recv(min_get=1), ValueError, "would wait forever"),
        (lambda: pool.async_step_recv(env_index=[0]), ValueError, "env 0 has no step"),
    ]
    for make_call, error, match in bad_inputs:
        with pytest.raises(error, match=match):
            await make_call()
        assert pool.stats().in_flight == 0
    await pool.async_step_send(echo_actions(1, env_index=[0]))
    with pytest.raises(Exception, match="env 0 already has a command in flight"):  # double send
        await pool.async_step_send(echo_actions(1, env_index=[0]))
    assert pool.stats().in_flight == 1
    _check_results(await pool.async_step_recv(env_index=[0], timeout=WAIT), [0], 1)
    _check_results(await pool.step(echo_actions(2, env_index=[1, 2])), [1, 2], 1)  # still usable
