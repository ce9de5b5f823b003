"""The pool's process ends, one way or another, and nothing of ours outlives it (I4, I5).

Each scenario runs a script in a fresh interpreter, with one env hung in a step (the
worst case for cleanup: that worker never reads another message).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.faults.support import WAIT, applies_to
from tests.helpers import assert_gone, shm_entries
from tests.ray_session import LOCAL_RAY

pytestmark = pytest.mark.slow  # a fresh interpreter per scenario

PREAMBLE = """
import asyncio, os, sys, uvloop
from aenvs import AsyncEnvPool
from aenvs.testing import Fault, faulty_env_fns
from tests.faults.support import echo_actions

def hung_pool(executor, release):
    faults = {{1: Fault("hang", at=1, release=release)}}
    fns = faulty_env_fns(2, faults, asynchronous=executor == "inline")
    return AsyncEnvPool(fns, executor=executor, envs_per_worker=1)

def worker_pids(pool):
    return getattr(pool.executor, "pids", [])

run = asyncio.run if {loop!r} == "asyncio" else uvloop.run
"""


def _python(body: str, loop: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(PREAMBLE.format(loop=loop)) + textwrap.dedent(body)]


def _env(executor: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    if executor == "ray":  # the session's cluster, where Ray ends the actors of a driver that is gone
        env["RAY_ADDRESS"] = LOCAL_RAY.address
    return env


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@applies_to("inline", "thread", "process", "ray")
def test_dropped_pool_does_not_hang_interpreter_exit(executor: str, loop: str, tmp_path) -> None:
    before = shm_entries()
    body = f"""
    async def main():
        pool = hung_pool({executor!r}, {str(tmp_path / "never")!r})
        await pool.start()
        await pool.reset()
        await pool.async_step_send(echo_actions(2))   # env 1 hangs for good
        await pool.async_step_recv(env_index=[0])
        print(*worker_pids(pool), flush=True)
        return pool                                   # dropped, never closed
    keep = run(main())
    """
    result = subprocess.run(
        _python(body, loop), capture_output=True, text=True, timeout=WAIT * 2, env=_env(executor)
    )
    assert result.returncode == 0, result.stderr
    assert_gone([int(p) for p in result.stdout.split()], timeout=WAIT)
    assert shm_entries() <= before


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
@applies_to("process", "ray")  # threads and coroutines die with the process by definition
def test_killed_parent_leaves_no_worker_and_no_shared_memory(executor: str, loop: str, tmp_path) -> None:
    before = shm_entries()
    body = f"""
    async def main():
        async with hung_pool({executor!r}, {str(tmp_path / "never")!r}) as pool:
            await pool.reset()
            await pool.async_step_send(echo_actions(2))
            await pool.async_step_recv(env_index=[0])
            print(*worker_pids(pool), flush=True)
            await asyncio.Event().wait()              # killed here, env 1 still hung
    run(main())
    """
    with subprocess.Popen(_python(body, loop), stdout=subprocess.PIPE, text=True, env=_env(executor)) as proc:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        proc.kill()
        proc.wait(timeout=WAIT)
    if executor == "process":
        assert len(pids) == 2
    assert_gone(pids, timeout=WAIT)
    assert shm_entries() <= before
