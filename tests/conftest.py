"""Every behaviour test runs on every executor and on both event loops."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import psutil
import pytest
import uvloop

from aenvs import AsyncEnvPool
from aenvs._zygote import zygote_pid
from tests.ray_session import LOCAL_RAY, actors_left

EXECUTORS = ["inline", "thread", "process", "ray"]
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


@pytest.fixture(scope="session", autouse=True)
def ray_session() -> Any:
    """Tests on the ray executor share one local Ray instance, shut down after the session."""
    yield LOCAL_RAY
    LOCAL_RAY.close()


@pytest.fixture(autouse=True)
def ray_when_needed(request: pytest.FixtureRequest) -> None:
    """Start the shared Ray instance for a test on the ray executor (also when a test
    parametrizes ``executor`` itself, as the fault scenarios do)."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("executor") == "ray":
        LOCAL_RAY.ensure()


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


@pytest.fixture
def sigint_default() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt during the test, as in a terminal, whatever this process
    inherited: a job started in the background by a non-interactive shell ignores SIGINT, and
    Python (like aenvs, which never replaces an ignored SIGINT) leaves it ignored."""
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)


@pytest.fixture(autouse=True)
def nothing_left_behind() -> Any:
    """After each test, every worker thread, worker process and Ray actor a pool started is gone."""
    yield
    left = actors_left(wait=10)
    assert not left, f"Ray actors left behind: {left}"
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
