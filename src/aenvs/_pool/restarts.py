"""The restart supervisor: rebuilds failed envs in the background (``on_error="restart"``).

A failed env is rebuilt from its factory after a backoff that doubles with each of its
restarts: in place when its worker lives, in a new worker when the worker died or hung
(the executor's ``respawn``). Past ``max_restarts`` it is broken: it stays in ERROR and
every later send to it fails at once. Commands to an env being rebuilt wait for it
(:meth:`RestartSupervisor.settle`); commands to the others never do.

A restart that ends an episode as truncated (``on_timeout="truncate"``) is free: it runs
at once, whatever ``on_error`` says, and is not charged against ``max_restarts`` (a timeout
is an expected end of an episode there, not a failing env); a retry after its rebuild
failed is charged as any other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from aenvs._errors import EnvError
from aenvs.executors import Executor

__all__ = ["RestartSupervisor"]

_MAX_BACKOFF = 30.0  # seconds

Then = Callable[[bool], None]  # told whether its env was rebuilt (False: it broke for good)


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

    Example:
        >>> from aenvs.executors import make_executor
        >>> async def rebuild(indices: list[int]) -> None: ...
        >>> supervisor = RestartSupervisor(make_executor("inline"), num_envs=2, max_restarts=0,
        ...     backoff=0.0, is_free=lambda i: True, rebuild_in_place=rebuild, rebuilt=print, broke=print)
        >>> async def main() -> None:
        ...     supervisor.failed(1, free=True, then=lambda rebuilt: print("rebuilt:", rebuilt))
        ...     await supervisor.settle([1])
        >>> asyncio.run(main())
        1
        rebuilt: True
        >>> supervisor.counts, supervisor.broken
        ([0, 1], set())
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
        self._charged = [0] * num_envs  # ... of them, those charged against max_restarts
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
        self._free: set[int] = set()  # queued envs whose next restart is free
        self._then: dict[int, list[Then]] = {}  # queued envs: what to call once rebuilt (or broken)
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()  # set whenever the task has nothing left to do

    @property
    def active(self) -> bool:
        """Whether envs are being restarted now."""
        return self._task is not None

    def failed(self, env_index: int, *, free: bool = False, then: Then | None = None) -> None:
        """Queue ``env_index`` for a restart (on the running loop).

        ``free``: at once and not charged against ``max_restarts``. ``then``: called with
        True once the env is rebuilt, or False if it broke (past its budget) or the
        supervisor stopped.
        """
        self._queued.add(env_index)
        if free:
            self._free.add(env_index)
        if then is not None:
            self._then.setdefault(env_index, []).append(then)
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
        self._then.clear()

    def forget(self) -> None:
        """Drop the task without waiting for it (its loop is not this one, or gone)."""
        self._task = None
        self._then.clear()

    def _tell(self, i: int, rebuilt: bool) -> None:
        for then in self._then.pop(i, ()):
            then(rebuilt)

    async def _run(self) -> None:
        try:
            while self._queued:
                for i in self._queued & self.broken:  # already past their budget
                    self._tell(i, False)
                batch = sorted(self._queued - self.broken)
                self._queued.clear()
                free, self._free = self._free, set()
                charged = self._charged
                for i in batch:
                    if i not in free and charged[i] >= self.max_restarts:
                        self.broken.add(i)
                        self._broke(i)
                        self._restarting.discard(i)
                        self._tell(i, False)
                batch = [i for i in batch if i not in self.broken]
                if not batch:
                    continue
                delay = max((self._backoff * 2 ** charged[i] for i in batch if i not in free), default=0.0)
                if delay:
                    await asyncio.sleep(min(delay, _MAX_BACKOFF))
                for i in batch:
                    self.counts[i] += 1
                    if i not in free:
                        charged[i] += 1
                await self._rebuild(batch)
                self._restarting.difference_update(set(batch) - self._queued)
        finally:
            self._restarting.clear()
            self._task = None
            self._idle.set()
            for i in list(self._then):  # stopped (the pool closes): nothing more is rebuilt
                self._tell(i, False)

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
            self._tell(i, True)
