"""The restart supervisor: rebuilds failed envs in the background (``on_error="restart"``).

A failed env is rebuilt from its factory after a backoff that doubles with each of its
restarts: in place when its worker lives, in a new worker when the worker died or hung
(the executor's ``respawn``). Past ``max_restarts`` it is broken: it stays in ERROR and
every later send to it fails at once. Commands to an env being rebuilt wait for it
(:meth:`RestartSupervisor.settle`); commands to the others never do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from aenvs._errors import EnvError
from aenvs.executors import Executor

__all__ = ["RestartSupervisor"]

_MAX_BACKOFF = 30.0  # seconds


class RestartSupervisor:
    """Rebuilds the envs :meth:`failed` names, one background task at a time.

    Args:
        executor: the pool's executor (``worker_alive`` / ``respawn`` for dead workers).
        num_envs: envs of the pool.
        max_restarts: restarts allowed per env.
        backoff: seconds before an env's first restart, doubled for each next one.
        is_free: whether an env has no command in flight (only those are rebuilt in place).
        rebuild_in_place: rebuilds envs whose worker lives (raises EnvError if a factory fails).
        rebuilt: called for each env rebuilt; ``broken`` for each past its budget.
    """

    def __init__(
        self,
        executor: Executor,
        *,
        num_envs: int,
        max_restarts: int,
        backoff: float,
        is_free: Callable[[int], bool],
        rebuild_in_place: Callable[[list[int]], Awaitable[None]],
        rebuilt: Callable[[int], None],
        broke: Callable[[int], None],
    ) -> None:
        self.counts = [0] * num_envs  # restarts per env
        self.broken: set[int] = set()  # past max_restarts: sends fail at once
        self.max_restarts = max_restarts
        self._executor = executor
        self._backoff = backoff
        self._is_free = is_free
        self._rebuild_in_place = rebuild_in_place
        self._rebuilt = rebuilt
        self._broke = broke
        self._queued: set[int] = set()  # failed envs waiting for the task
        self._restarting: set[int] = set()  # ... and those it is rebuilding now
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()  # set whenever the task has nothing left to do

    @property
    def active(self) -> bool:
        """Whether envs are being restarted now."""
        return self._task is not None

    def failed(self, env_index: int) -> None:
        """Queue ``env_index`` for a restart (on the running loop)."""
        self._queued.add(env_index)
        self._restarting.add(env_index)
        self._idle.clear()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def check_not_broken(self, indices: Sequence[int], executor: str) -> None:
        """Raise EnvError for the first env of ``indices`` past its restart budget."""
        for i in indices:
            if i in self.broken:
                raise EnvError(
                    i,
                    "send",
                    message=f"env {i} failed again after {self.max_restarts} restarts (max_restarts) "
                    f"on the {executor} executor; it stays in ERROR",
                    executor=executor,
                )

    async def settle(self, indices: Sequence[int]) -> None:
        """Wait until none of ``indices`` is being restarted."""
        while self._task is not None and not self._restarting.isdisjoint(indices):
            await self._idle.wait()

    async def aclose(self) -> None:
        """Stop restarting (what is being rebuilt is left as it is)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def forget(self) -> None:
        """Drop the task without waiting for it (its loop is not this one, or gone)."""
        self._task = None

    async def _run(self) -> None:
        try:
            while self._queued:
                batch = sorted(self._queued - self.broken)
                self._queued.clear()
                for i in batch:
                    if self.counts[i] >= self.max_restarts:
                        self.broken.add(i)
                        self._broke(i)
                        self._restarting.discard(i)
                batch = [i for i in batch if i not in self.broken]
                if not batch:
                    continue
                delay = max(self._backoff * 2 ** self.counts[i] for i in batch)
                if delay:
                    await asyncio.sleep(min(delay, _MAX_BACKOFF))
                for i in batch:
                    self.counts[i] += 1
                await self._rebuild(batch)
                self._restarting.difference_update(set(batch) - self._queued)
        finally:
            self._restarting.clear()
            self._task = None
            self._idle.set()

    async def _rebuild(self, batch: list[int]) -> None:
        """Rebuild ``batch``: a new worker where the old one is dead, in place elsewhere."""
        executor = self._executor
        dead = [i for i in batch if not executor.worker_alive(i)]
        rebuilt: list[int] = []
        if dead:
            try:
                rebuilt = await executor.respawn(dead)
            except Exception:
                self._queued.update(dead)  # a factory failed: try again, within the budget
        in_place = [i for i in batch if i not in dead and self._is_free(i)]
        if in_place:
            try:
                await self._rebuild_in_place(in_place)
            except EnvError:
                self._queued.update(in_place)
            else:
                rebuilt.extend(in_place)
        for i in rebuilt:
            self._rebuilt(i)
