"""Every env object a pool builds is closed exactly once, on every path (issue #19 item 4).

The envs (tests/faults/close_envs.py) log each construction and each close to a file,
so the count holds across threads, processes and Ray actors. Only where an env's
process was killed outright (a SIGKILL, Ray's kill) may an object stay unclosed, and
the test names those objects; nothing is ever closed twice. Closes that come after the
pool returned (an abandoned thread's, once its stuck step ends) are awaited by polling
the log within a bound. What runs when, per executor: docs/guide/clean-up.md.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from pathlib import Path
from typing import Literal

import pytest

from aenvs import AsyncEnvPool, EnvCrashedError, EnvError, EnvTimeoutError, ParallelEnv
from aenvs.executors import make_executor
from tests.faults.close_envs import Events, Kind, mixed, wait_for_closes
from tests.faults.support import WAIT, applies_to, collect, echo_actions

pytestmark = pytest.mark.timeout(90)

OnError = Literal["raise", "restart"]
MIXED: tuple[Kind, ...] = ("sync", "async", "resource")  # a plain env, an async one, one with a task


def _check(events: Events, *, built: int, killed: int = 0) -> None:
    """``built`` objects in all; every one closed once, but ``killed`` of them (their process
    was killed outright) never closed; none closed twice."""
    assert len(events.built) == built, events
    assert events.closed_twice() == [], events
    assert len(events.unclosed()) == killed, events.unclosed()


async def _closes(tmp_path: Path, built: int, killed: int = 0) -> Events:
    events = await wait_for_closes(tmp_path, built - killed, timeout=WAIT)
    _check(events, built=built, killed=killed)
    return events


async def test_normal_close(executor: str, tmp_path: Path) -> None:
    async with AsyncEnvPool(mixed(tmp_path, MIXED), executor=executor, envs_per_worker=1) as pool:
        await pool.reset()
        await pool.step(echo_actions(3))
    await _closes(tmp_path, 3)


async def test_close_with_steps_in_flight(executor: str, tmp_path: Path) -> None:
    """The driver gives up on a receive (its task cancelled) and closes the pool while
    every env is in the middle of a step."""
    release = tmp_path / "release"
    # a plain env stuck in a step would block the inline executor's loop: only the async ones hang there
    hang = ((1, 1), (2, 1)) if executor == "inline" else ((0, 1), (1, 1), (2, 1))
    fns = mixed(tmp_path, MIXED, hang=hang, release=str(release))
    pool = AsyncEnvPool(fns, executor=executor, envs_per_worker=1, close_timeout=0.5)
    try:
        await pool.start()
        await pool.reset()
        await pool.async_step_send(echo_actions(3))
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):
                await pool.async_step_recv(min_get=3)
        async with asyncio.timeout(WAIT):
            await pool.aclose()
    finally:
        release.touch()  # what is still stuck (an abandoned thread) may end, and close its env
    # ray: a plain env stuck in its step holds its actor's loop: the actor is killed after close_timeout
    await _closes(tmp_path, 3, killed=1 if executor == "ray" else 0)


async def test_kill(executor: str, tmp_path: Path) -> None:
    pool = AsyncEnvPool(mixed(tmp_path, MIXED), executor=executor, envs_per_worker=1, close_timeout=2.0)
    await pool.start()
    await pool.reset()
    pool.kill()
    # ray: kill() kills the actors outright (use aclose to close their envs)
    await _closes(tmp_path, 3, killed=3 if executor == "ray" else 0)


def test_kill_outside_the_loop(executor: str, loop_factory, tmp_path: Path) -> None:
    """``kill()`` from sync code while the pool's loop is idle (a finalizer, a sync script)."""
    pool = AsyncEnvPool(mixed(tmp_path, MIXED), executor=executor, envs_per_worker=1, close_timeout=2.0)
    loop = loop_factory()
    try:
        loop.run_until_complete(pool.start())
        loop.run_until_complete(pool.step(echo_actions(3)))
        pool.kill()
        loop.run_until_complete(_closes(tmp_path, 3, killed=3 if executor == "ray" else 0))
    finally:
        loop.close()


@pytest.mark.parametrize("on_error", ["raise", "restart"])
async def test_step_timeout(executor: str, on_error: OnError, tmp_path: Path) -> None:
    """A step outlives step_timeout: its env's command is aborted (its worker stopped)."""
    release = tmp_path / "release"
    # inline: a plain env stuck in a step would block the loop; ray: one would hold its actor's
    # loop, so that the actor is killed (test_close_with_steps_in_flight has that case)
    kind: Kind = "resource" if executor in ("inline", "ray") else "sync"
    fns = mixed(tmp_path, (kind, kind), hang=((1, 1),), release=str(release))
    try:
        async with AsyncEnvPool(
            fns,
            executor=executor,
            envs_per_worker=1,
            step_timeout=0.5,  # the other env's step within it, on a loaded machine too
            on_error=on_error,
            restart_backoff=0,
            close_timeout=0.5,
        ) as pool:
            await pool.reset()
            await pool.async_step_send(echo_actions(2))
            _, errors = await collect(pool, 2)
            assert [type(e) for e in errors] == [EnvTimeoutError]
            if on_error == "restart":
                await pool.reset()
                await pool.step(echo_actions(2))
    finally:
        release.touch()
    await _closes(tmp_path, 3 if on_error == "restart" else 2)  # on restart: the aborted one's successor


async def test_restart_after_an_env_raises(executor: str, tmp_path: Path) -> None:
    fns = mixed(tmp_path, MIXED, raise_at=((0, 1), (1, 1), (2, 1)))
    async with AsyncEnvPool(
        fns, executor=executor, envs_per_worker=1, on_error="restart", restart_backoff=0
    ) as pool:
        await pool.reset()
        await pool.async_step_send(echo_actions(3))
        errors = await collect_errors(pool, 3)
        assert sorted(e.env_index for e in errors) == [0, 1, 2]
        await pool.reset()  # waits for the restarts
        await pool.step(echo_actions(3))
    await _closes(tmp_path, 6)  # each old object closed by its restart, each new one by the close


async def collect_errors(pool: AsyncEnvPool, n: int) -> list[EnvError]:
    """Receive step answers until ``n`` errors came."""
    errors: list[EnvError] = []
    async with asyncio.timeout(WAIT):
        while len(errors) < n:
            try:
                await pool.async_step_recv(min_get=1)
            except EnvError as error:
                errors.append(error)
    return errors


@applies_to("process", "ray")  # a thread or the loop cannot die alone
@pytest.mark.parametrize("on_error", ["raise", "restart"])
async def test_worker_killed(executor: str, on_error: OnError, tmp_path: Path) -> None:
    """A worker is SIGKILLed: its env cannot close, is reported, and is not closed twice."""
    fns = mixed(tmp_path, ("sync", "sync", "resource"), sigkill_at=((1, 1),))
    async with AsyncEnvPool(
        fns, executor=executor, envs_per_worker=1, on_error=on_error, restart_backoff=0
    ) as pool:
        await pool.reset()
        await pool.async_step_send(echo_actions(3))
        _, errors = await collect(pool, 3)
        assert [(type(e), e.env_index) for e in errors] == [(EnvCrashedError, 1)]
        if on_error == "restart":
            await pool.reset()
            await pool.step(echo_actions(3))
    events = await _closes(tmp_path, 4 if on_error == "restart" else 3, killed=1)
    assert list(events.unclosed().values()) == [1]


async def test_a_close_that_raises_or_hangs_stops_no_other(executor: str, tmp_path: Path) -> None:
    """All envs in one worker: one close raises, one hangs (bounded by close_timeout), and
    every env's close still runs, once; the pool's close returns within its bound."""
    fns = mixed(tmp_path, ("sync", "async", "resource", "sync"), bad_close=((0, "raise"), (1, "hang")))
    pool = AsyncEnvPool(fns, executor=executor, envs_per_worker=4, close_timeout=0.3)
    await pool.start()
    await pool.reset()
    await pool.step(echo_actions(4))
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(WAIT):
        await pool.aclose()
    assert loop.time() - started < 3.0
    await _closes(tmp_path, 4)


def test_sync_shim_close(executor: str, tmp_path: Path) -> None:
    with ParallelEnv(3, mixed(tmp_path, MIXED), executor=executor) as env:
        env.rollout(2)
    _check(asyncio.run(wait_for_closes(tmp_path, 3, timeout=WAIT)), built=3)


@pytest.mark.usefixtures("sigint_default")
def test_sync_shim_ctrl_c_then_close(executor: str, tmp_path: Path) -> None:
    """Ctrl-C while a sync step waits for a hung env, then close: every env closes once."""
    release = tmp_path / "release"
    fns = mixed(tmp_path, ("resource", "resource"), hang=((1, 1),), release=str(release))
    chosen = make_executor(executor)
    chosen.close_timeout = 0.5
    env = ParallelEnv(2, fns, executor=chosen)
    try:
        env.reset()

        def interrupt() -> None:
            deadline = time.monotonic() + WAIT
            while not Events.read(tmp_path).hanging and time.monotonic() < deadline:
                time.sleep(0.01)
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

        interrupter = threading.Thread(target=interrupt)
        interrupter.start()
        with pytest.raises(KeyboardInterrupt):
            env.step(echo_actions(2))
        interrupter.join()
        env.close()
    finally:
        release.touch()
    _check(asyncio.run(wait_for_closes(tmp_path, 2, timeout=WAIT)), built=2)
