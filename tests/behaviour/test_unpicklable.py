"""Env factories and make kwargs that cannot be pickled, on the executors that pickle them
(process, ray): a TypeError naming the env, what could not be pickled and why, raised
before any worker starts; nothing is left running, and a pool can be built again."""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import psutil
import pytest

from aenvs import AsyncEnvPool
from aenvs._zygote import zygote_pid
from tests.helpers import SHM_PREFIX, SharedMemory, shared_memory_of
from tests.ray_session import actors_left

PICKLING = pytest.mark.parametrize("executor", ["process", "ray"])
LOCK_REASON = "cannot pickle '_thread.lock' object"


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def closing_over_a_lock() -> Callable[[], gym.Env]:
    lock = threading.Lock()

    def make() -> gym.Env:
        with lock:
            return gym.make("CartPole-v1")

    return make


class SocketEnvMaker:
    """A factory object that holds a socket (a connection to a simulator, say)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def __call__(self) -> gym.Env:
        return gym.make("CartPole-v1")


@pytest.fixture
def sock() -> Iterator[socket.socket]:
    left, right = socket.socketpair()
    with left, right:
        yield left


def _our_shared_memory() -> set[SharedMemory]:
    """What this process holds of aenvs's memfds and of named /dev/shm files (not Ray's
    object store, which it maps once unlinked)."""
    held = shared_memory_of([os.getpid()])
    return {m for m in held if m.path == f"/memfd:{SHM_PREFIX}" or not m.deleted}


def _workers_running() -> list[int]:
    """Worker processes of this test process (children of its zygote): none was started, so
    none is there, not even one being killed."""
    pid = zygote_pid()
    return [] if pid is None else [child.pid for child in psutil.Process(pid).children()]


async def _refused(executor: str, env_fns: list[Any], **options: Any) -> TypeError:
    """Start a pool of ``env_fns``: it must fail with a TypeError, close, and leave nothing."""
    shared_before = _our_shared_memory()
    pool = AsyncEnvPool(env_fns, executor=executor, envs_per_worker=1, **options)
    with pytest.raises(TypeError) as info:
        await pool.start()
    assert pool.is_closed
    await pool.aclose()  # idempotent
    assert _workers_running() == []
    assert actors_left(wait=10) == []
    assert not [t.name for t in threading.enumerate() if t.name.startswith("aenvs-thread-")]
    assert _our_shared_memory() <= shared_before
    # built again, on the same executor, with factories that pickle: it works
    async with AsyncEnvPool([cartpole] * 2, executor=executor, envs_per_worker=1) as again:
        td = await again.reset()
        assert td.batch_size[0] == 2
    return info.value


@PICKLING
async def test_a_factory_closing_over_a_lock_is_named(executor: str) -> None:
    bad = closing_over_a_lock()
    error = await _refused(executor, [cartpole, cartpole, bad, bad])
    message = str(error)
    assert message.startswith("env 2 "), message  # the first env that fails
    assert f"factory {bad!r}" in message
    assert LOCK_REASON in message
    assert executor in message


@PICKLING
async def test_a_factory_holding_a_socket_is_named(executor: str, sock: socket.socket) -> None:
    bad = SocketEnvMaker(sock)
    error = await _refused(executor, [bad, cartpole])
    message = str(error)
    assert message.startswith("env 0 "), message
    assert re.search(r"factory <.*SocketEnvMaker object at 0x", message), message
    assert "cannot pickle 'socket' object" in message


@PICKLING
async def test_a_make_kwargs_entry_that_cannot_be_pickled_is_named(executor: str) -> None:
    lock = threading.Lock()
    error = await _refused(
        executor,
        ["CartPole-v1"] * 3,
        make_kwargs=[{}, {"max_episode_steps": 9}, {"max_episode_steps": 9, "hook": lock}],
    )
    message = str(error)
    assert message.startswith("env 2 "), message
    assert f"make_kwargs entry 'hook' ({lock!r})" in message
    assert LOCK_REASON in message
