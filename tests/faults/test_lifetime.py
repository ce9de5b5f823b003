"""The pool's process ends, one way or another, and nothing of ours outlives it (I4, I5).

Each scenario runs a script in a fresh interpreter, with one env hung in a step (the
worst case for cleanup: that worker never reads another message). "Ours" is what the
script's own processes held: its workers, and the shared memory that it and they had
mapped or open (never the whole of /dev/shm, where other programs come and go).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.faults.support import WAIT, applies_to
from tests.helpers import SHM_PREFIX, SharedMemory, assert_gone, left_in_dev_shm, shm_entries
from tests.ray_session import LOCAL_RAY

pytestmark = pytest.mark.slow  # a fresh interpreter per scenario

PREAMBLE = """
import asyncio, json, os, sys, uvloop
from aenvs import AsyncEnvPool
from aenvs.testing import Fault, faulty_env_fns
from tests.faults.support import echo_actions
from tests.helpers import shared_memory_of

def hung_pool(executor, release):
    faults = {{1: Fault("hang", at=1, release=release)}}
    fns = faulty_env_fns(2, faults, asynchronous=executor == "inline")
    return AsyncEnvPool(fns, executor=executor, envs_per_worker=1)

def report(pool):  # one line: the workers' pids, and the shared memory this process and they hold
    pids = getattr(pool.executor, "pids", [])
    held = sorted(shared_memory_of([os.getpid(), *pids]))
    print(json.dumps({{"pids": pids, "held": held}}), flush=True)

run = asyncio.run if {loop!r} == "asyncio" else uvloop.run
"""


def _python(body: str, loop: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(PREAMBLE.format(loop=loop)) + textwrap.dedent(body)]


def _read_report(line: str, executor: str) -> tuple[list[int], list[SharedMemory]]:
    report = json.loads(line)
    held = [SharedMemory(*entry) for entry in report["held"]]
    if executor == "process":  # what is checked below is there to see: the pool's arena
        assert any(entry.path == f"/memfd:{SHM_PREFIX}" for entry in held), held
    return report["pids"], held


def _assert_nothing_left(pids: list[int], held: list[SharedMemory]) -> None:
    """The workers are gone, and so is every shared-memory file they or the pool's process held
    (memfds go with the last process holding them; a named file in /dev/shm would stay)."""
    assert_gone(pids, timeout=WAIT)
    assert left_in_dev_shm(held) == []


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
        report(pool)
        return pool                                   # dropped, never closed
    keep = run(main())
    """
    result = subprocess.run(
        _python(body, loop), capture_output=True, text=True, timeout=WAIT * 2, env=_env(executor)
    )
    assert result.returncode == 0, result.stderr
    _assert_nothing_left(*_read_report(result.stdout, executor))
    assert shm_entries() <= before


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_thread_pool_dropped_while_a_worker_lock_is_held_lets_the_interpreter_exit(loop: str) -> None:
    # A daemon thread that holds a worker's lock when the interpreter begins to exit (it
    # was answering) is stopped there for good, the lock held; the dropped pool's __del__
    # runs after that. The lock taken here and never released stands for it.
    body = """
    async def main():
        pool = AsyncEnvPool(faulty_env_fns(2, {}), executor="thread", envs_per_worker=1)
        await pool.start()
        await pool.reset()
        return pool                                   # dropped, never closed
    keep = run(main())
    keep.executor._workers[0].lock.acquire()
    print("held", flush=True)
    """
    result = subprocess.run(
        _python(body, loop), capture_output=True, text=True, timeout=WAIT * 2, env=_env("thread")
    )
    assert result.stdout.split() == ["held"], result.stderr
    assert result.returncode == 0, result.stderr


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
            report(pool)
            await asyncio.Event().wait()              # killed here, env 1 still hung
    run(main())
    """
    with subprocess.Popen(_python(body, loop), stdout=subprocess.PIPE, text=True, env=_env(executor)) as proc:
        assert proc.stdout is not None
        pids, held = _read_report(proc.stdout.readline(), executor)
        proc.kill()
        proc.wait(timeout=WAIT)
    if executor == "process":
        assert len(pids) == 2
    _assert_nothing_left(pids, held)
    assert shm_entries() <= before
