"""The pool's limits: at most ``max_concurrency`` transition commands running, and a rate limit.

A transition command (reset, step, step-and-reset) over a limit is held in the pool, env by
env in the order the envs were sent, and dispatched as running commands complete and the
rate limit's tokens come. A held command counts as sent: its env is busy, a receive may
wait for it. While something is held, a task of the pool's moves it on, so held commands
progress with nobody receiving. Without limits none of this exists.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable

from aenvs._commands import Command, CommandKind, Completion, RemoteError
from aenvs._pool.latency import LatencyWindows
from aenvs._pool.slots import SlotTable
from aenvs._rate_limit import RateLimit

__all__ = ["Limits"]


class Limits:
    """The held transition commands of one pool, and the limits that let them go.

    Args:
        slots: the pool's slot table: which commands completed; the dispatch times, written here.
        max_concurrency: transition commands running on the executor at once, or None.
        rate_limit: the bucket each dispatched transition command takes a token per env from, or None.
        dispatch: hands a command to the executor (with the time it was sent: its timeout's
            identity).
        drain: records in ``slots`` the completions that arrived.
        wait_ready: waits until completions may have arrived.
        wake: wakes the pool's waiting receives.
        closed: whether the pool is closed.

    Example:
        >>> slots, went = SlotTable(3), []
        >>> async def nothing() -> None: ...
        >>> limits = Limits(slots, max_concurrency=1, rate_limit=None,
        ...     dispatch=lambda command, sent_at: went.append(command.env_indices),
        ...     drain=lambda: None, wait_ready=nothing, wake=lambda: None, closed=lambda: True)
        >>> async def send() -> None:
        ...     slots.sent(CommandKind.STEP, [0, 1, 2], now=1.0)
        ...     limits.admit(Command(CommandKind.STEP, [0, 1, 2]), sent_at=1.0)
        >>> asyncio.run(send())
        >>> went, limits.held
        ([[0]], 2)
    """

    def __init__(
        self,
        slots: SlotTable,
        *,
        max_concurrency: int | None,
        rate_limit: RateLimit | None,
        dispatch: Callable[[Command, float], None],
        drain: Callable[[], None],
        wait_ready: Callable[[], Awaitable[None]],
        wake: Callable[[], None],
        closed: Callable[[], bool],
    ) -> None:
        self.max_concurrency = max_concurrency
        self.rate_limit = rate_limit
        self.wait = LatencyWindows(slots.num_envs)  # send to dispatch, per transition command
        self.wait_seconds = 0.0  # total time commands spent held
        self._slots = slots
        self._dispatch = dispatch
        self._drain = drain
        self._wait_ready = wait_ready
        self._wake = wake
        self._closed = closed
        self._held: deque[int] = deque()  # the held envs, in the order they were sent
        self._commands: dict[int, tuple[Command, float]] = {}  # held env -> its command, sent when
        self._running: dict[int, float] = {}  # env -> send time of its dispatched command
        self._rate_bound = False  # the last release stopped for want of tokens (not of room)
        self._task: asyncio.Task[None] | None = None
        slots.dispatched_at = [0.0] * slots.num_envs  # no longer the send times

    @property
    def held(self) -> int:
        """Commands held now (one per env)."""
        return len(self._held)

    def admit(self, command: Command, sent_at: float) -> None:
        """A transition command was sent at ``sent_at`` (recorded in the slot table): dispatch
        what the limits let go now, behind the commands held already; hold the rest."""
        held, commands = self._held, self._commands
        for i in command.env_indices:
            held.append(i)
            commands[i] = (command, sent_at)
        self._release(sent_at)
        if held and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._move_on())

    def close(self) -> None:
        """The pool closes: forget the held commands (never dispatched), stop moving them on."""
        by_kind: dict[CommandKind, list[int]] = {}
        for i in self._held:
            by_kind.setdefault(self._commands[i][0].kind, []).append(i)
        for kind, indices in by_kind.items():
            self._slots.withdraw(kind, indices)
        self._held.clear()
        self._commands.clear()
        self._running.clear()
        task, self._task = self._task, None
        if task is None or task.done():
            return
        loop = task.get_loop()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            task.cancel()
        elif not loop.is_closed():  # closed from another thread (a finalizer): cancel on its loop
            loop.call_soon_threadsafe(task.cancel)

    # -- letting commands go ------------------------------------------------------------

    def _room(self) -> int:
        """How many more commands may run now (``max_concurrency`` less those running)."""
        assert self.max_concurrency is not None
        running, pending, sent_at = self._running, self._slots.pending, self._slots.sent_at
        for i, sent in list(running.items()):
            if pending[i] is None or sent_at[i] != sent:  # completed (maybe sent again since)
                del running[i]
        return self.max_concurrency - len(running)

    def _release(self, now: float) -> None:
        """Dispatch, from the front, the held commands the limits let go at time ``now``."""
        held = self._held
        free = len(held)
        self._rate_bound = False
        if self.max_concurrency is not None:
            room = self._room()
            if room < free:
                self._drain()  # completions that arrived but are not recorded free room too
                room = self._room()
            free = min(free, room)
        if free > 0 and self.rate_limit is not None:
            tokens = self.rate_limit.take(free)
            self._rate_bound = tokens < free
            free = tokens
        if free <= 0:
            return
        going = [held.popleft() for _ in range(free)]
        commands = self._commands
        start = 0
        while start < len(going):  # the envs of one command that go together, in one command
            command, sent_at = commands[going[start]]
            end = start + 1
            while end < len(going) and commands[going[end]][0] is command:
                end += 1
            group = going[start:end]
            for i in group:
                del commands[i]
            self._go(command, group, sent_at, now)
            start = end

    def _go(self, command: Command, group: list[int], sent_at: float, now: float) -> None:
        """Dispatch ``command`` to the envs ``group`` (all its envs, or some) at time ``now``."""
        part = command if len(group) == len(command.env_indices) else command.subset(group)
        dispatched_at, add = self._slots.dispatched_at, self.wait.add
        waited = now - sent_at
        for i in group:
            dispatched_at[i] = now
            add(i, waited)
        self.wait_seconds += waited * len(group)
        if self.max_concurrency is not None:
            running = self._running
            for i in group:
                running[i] = sent_at
        try:
            self._dispatch(part, sent_at)
        except Exception as exc:  # e.g. an action that cannot travel: its envs answer with it
            error = RemoteError.capture(exc)
            self._slots.record([Completion(i, command.kind, error=error) for i in group], time.perf_counter())
            self._wake()

    async def _move_on(self) -> None:
        """Dispatch held commands as running ones complete and tokens come, until none is held."""
        try:
            while self._held and not self._closed():
                self._release(time.perf_counter())
                if not self._held:
                    break
                if self._rate_bound:
                    assert self.rate_limit is not None
                    await asyncio.sleep(self.rate_limit.seconds_until_token())
                else:
                    await self._wait_ready()
                    self._drain()
        except asyncio.CancelledError:
            raise
        except BaseException:  # an interrupt an env raised, passed on by a drain: carry on after it
            asyncio.get_running_loop().call_soon(self._resume)
            raise
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    def _resume(self) -> None:
        if self._held and self._task is None and not self._closed():
            self._task = asyncio.get_running_loop().create_task(self._move_on())
