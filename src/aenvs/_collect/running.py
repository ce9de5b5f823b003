"""A collection running: its driver's task, the items handed out and not taken yet, and the
gate that lets the driver start new work only while a consumer waits for an item and no
other caller's call holds the pool."""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from collections.abc import Callable

from aenvs._collect.driver import Driver
from aenvs._collect.outputs import Episode, FrameBatch
from aenvs._collect.plan import EpisodePlan

__all__ = ["Collected", "Running"]

Collected = Episode | FrameBatch


class Running:
    """A collection running: the driver's task, the items it handed out and not taken yet,
    and the gate (open while a consumer waits for an item and no other caller's call holds
    the pool).

    Args:
        plan: the collection's episodes (told which tasks' episodes are handed out).
        acting: the context the driver's task runs in (its pool calls are the collector's own).

    Example:
        >>> import contextvars
        >>> from aenvs import AsyncEnvPool
        >>> from aenvs._collect.driver import Settings
        >>> async def main():
        ...     async with AsyncEnvPool("CartPole-v1", num_envs=2, executor="inline") as pool:
        ...         plan = EpisodePlan(2, tasks=None, total_episodes=3, episodes_per_env=None)
        ...         running = Running(plan, contextvars.copy_context())
        ...         policy = lambda td: [0] * td.batch_size[0]
        ...         driver = Driver(pool, policy, Settings(None, None, 1, None, True, None, "raise"), plan, running.put)
        ...         running.start(driver, ended=lambda: None)
        ...         lengths = []
        ...         while True:
        ...             try:
        ...                 lengths.append((await running.next()).length)
        ...             except StopAsyncIteration:
        ...                 return len(lengths)
        >>> asyncio.run(main())
        3
    """

    def __init__(self, plan: EpisodePlan, acting: contextvars.Context) -> None:
        self.items: deque[tuple[Collected, list[int]]] = deque()
        self.task: asyncio.Task[None] | None = None
        self.failure: BaseException | None = None  # what ended it from outside its task
        self.consumers = 0  # waiting for an item
        self._lent = 0  # other callers' calls under way
        self._plan = plan
        self._driver: Driver | None = None
        self._waiters: list[asyncio.Future[None]] = []
        self._acting = acting  # where the pool calls are the collector's own (see aenvs._pool.holding)

    def start(self, driver: Driver, ended: Callable[[], None]) -> None:
        self._driver = driver
        self._update()
        self.task = asyncio.get_running_loop().create_task(driver.run(), context=self._acting)
        self.task.add_done_callback(lambda task: self._finished(task, ended))

    @property
    def finished(self) -> bool:
        return self.task is None or self.task.done()

    def _finished(self, task: asyncio.Task[None], ended: Callable[[], None]) -> None:
        if not task.cancelled():
            task.exception()  # retrieved here, raised by next(): no "never retrieved" warning
        ended()
        self._wake()

    def _update(self) -> None:
        if self._driver is not None:
            self._driver.open_gate(self.consumers > 0 and not self.items and not self._lent)

    def lend(self, change: int) -> None:
        """An other caller's call begins (1) or ends (-1): the driver holds back meanwhile."""
        self._lent = max(0, self._lent + change)
        self._update()

    async def quiesce(self) -> None:
        """The driver's :meth:`~Driver.quiesce`, in a task of its own acting for the collector."""
        if self._driver is None:
            return
        # a caller that gives up cancels the wait too (receiving is cancellation-safe)
        await asyncio.get_running_loop().create_task(self._driver.quiesce(), context=self._acting)

    def put(self, item: Collected, numbers: list[int]) -> None:
        self.items.append((item, numbers))
        self._update()
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def next(self) -> Collected:
        while not self.items:
            task = self.task
            assert task is not None
            if self.failure is not None:
                raise self.failure
            if task.done():
                if not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # pyright: ignore[reportGeneralTypeIssues]
                raise StopAsyncIteration
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            self.consumers += 1
            self._update()
            try:
                await waiter
            finally:
                self.consumers -= 1
                self._update()
        item, numbers = self.items.popleft()
        for number in numbers:
            self._plan.handed_out(number)
        self._update()
        return item

    def fail(self, exc: BaseException) -> None:
        """End the collection with ``exc`` (raised once what was handed out is taken)."""
        if self.failure is None:
            self.failure = exc
        self.stop_now()

    def stop_now(self) -> None:
        """Stop from synchronous code: nothing more is sent, what is in flight is abandoned."""
        if self._driver is not None:
            self._driver.stop_now()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self._wake()

    async def stop(self) -> None:
        task = self.task
        if task is None:
            return
        if not task.done():
            task.cancel()
            await asyncio.wait([task])
        if not task.cancelled() and task.exception() is not None:
            task.exception()  # retrieved: raised by next(), not by stopping
