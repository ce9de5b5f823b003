"""Every behaviour test runs on every executor and on both event loops."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psutil
import pytest
import uvloop

from aenvs import AsyncEnvPool
from aenvs.zygote import zygote_pid

EXECUTORS = ["inline", "thread", "process"]  # "ray" joins when it lands
LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}

PoolFactory = Callable[..., Awaitable[AsyncEnvPool]]


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[str, Any]:
    return LOOPS


@pytest.fixture(params=EXECUTORS)
def executor(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(params=list(LOOPS))
def loop_factory(request: pytest.FixtureRequest) -> Callable[[], asyncio.AbstractEventLoop]:
    """For sync tests that drive a loop themselves (hypothesis)."""
    return LOOPS[request.param]


@pytest.fixture
async def make_pool(executor: str) -> AsyncIterator[PoolFactory]:
    """``pool = await make_pool(env_fns, **options)``: started on the test's executor, always closed."""
    async with contextlib.AsyncExitStack() as stack:

        async def make(env_fns: Any, **options: Any) -> AsyncEnvPool:
            return await stack.enter_async_context(AsyncEnvPool(env_fns, executor=executor, **options))

        yield make


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Any:
    """After each test, every worker thread and worker process a pool started is gone."""
    yield
    for thread in threading.enumerate():
        if thread.name.startswith("aenvs-thread-"):
            thread.join(timeout=10)
    alive = [t.name for t in threading.enumerate() if t.name.startswith("aenvs-thread-") and t.is_alive()]
    assert not alive, f"threads left behind: {alive}"
    pid = zygote_pid()
    if pid is not None:
        deadline = time.monotonic() + 10
        while (children := psutil.Process(pid).children()) and time.monotonic() < deadline:
            psutil.wait_procs(children, timeout=0.5)
        assert not psutil.Process(pid).children(), "worker processes left behind"
