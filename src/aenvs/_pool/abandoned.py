"""Whole-batch commands whose caller gave up, and the dropping of their results.

A whole-batch call (``reset``, ``step``, ...) that is cancelled (a task cancel, Ctrl-C in
the sync shim) or interrupted by one env's failure leaves results due that nobody will
receive. They are dropped when they arrive, so that the next whole-batch call finds its
envs free instead of busy.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from aenvs._commands import CommandKind
from aenvs._errors import EnvError
from aenvs._pool.slots import SlotTable

__all__ = ["AbandonedCommands"]


class AbandonedCommands:
    """Env index -> (kind, send time) of the whole-batch commands whose caller gave up.

    Args:
        slots: the pool's slot table, whose ready results are dropped.
        drain: records in ``slots`` what arrived.
        wait_ready: waits until more may have arrived.
        dropped: called after results were dropped (waiting receives may need to know).
        closed: whether the pool is closed (nothing will arrive: all is forgotten).

    Example:
        >>> from aenvs._commands import CommandKind, Completion
        >>> slots = SlotTable(1)
        >>> slots.sent(CommandKind.STEP, [0], now=1.0)
        >>> async def wait_ready() -> None: ...
        >>> abandoned = AbandonedCommands(
        ...     slots, drain=lambda: None, wait_ready=wait_ready, dropped=lambda: None, closed=lambda: False
        ... )
        >>> abandoned.abandon(CommandKind.STEP, [0])
        >>> abandoned.discard(), bool(abandoned)  # still due
        (True, True)
        >>> slots.record([Completion(0, CommandKind.STEP)], now=2.0)
        >>> abandoned.discard(), bool(abandoned), slots.ready
        (False, False, {})
    """

    def __init__(
        self,
        slots: SlotTable,
        *,
        drain: Callable[[], None],
        wait_ready: Callable[[], Awaitable[None]],
        dropped: Callable[[], None],
        closed: Callable[[], bool],
    ) -> None:
        self.commands: dict[int, tuple[CommandKind, float]] = {}
        self._slots = slots
        self._drain = drain
        self._wait_ready = wait_ready
        self._dropped = dropped
        self._closed = closed

    def __bool__(self) -> bool:
        return bool(self.commands)

    def give_up(self, exc: BaseException, kind: CommandKind, indices: Sequence[int]) -> None:
        """A whole-batch call ends without its results: cancelled, interrupted, or one env failed.

        Cancelled: the results still due are dropped when they arrive. An env failed: the
        other results stay ready for an ``async_*_recv``, and the next whole-batch call drops
        those still unreceived, so it finds every env free.
        """
        if not isinstance(exc, Exception):
            self.abandon(kind, indices)
        elif isinstance(exc, EnvError):
            self.abandon(kind, indices, drop_now=False)

    def abandon(self, kind: CommandKind, indices: Sequence[int], *, drop_now: bool = True) -> None:
        """Nobody will receive the results of the ``kind`` command to ``indices``."""
        sent_at = self._slots.sent_at
        for i in indices:
            self.commands[i] = (kind, sent_at[i])
        if drop_now:
            self.discard()

    def discard(self) -> bool:
        """Drop the results of abandoned commands that arrived; whether some are still due."""
        commands = self.commands
        if not commands:
            return False
        if self._closed():
            commands.clear()
            return False
        self._drain()
        slots = self._slots
        for i, (kind, sent_at) in list(commands.items()):
            c = slots.ready.get(i)
            if slots.sent_at[i] != sent_at or (c is None and slots.pending[i] is not kind):
                del commands[i]  # received by someone else, or superseded by a newer command
            elif c is not None and c.kind is kind:
                slots.drop(i)
                del commands[i]
                self._dropped()
        return bool(commands)

    async def settle(self) -> None:
        """Wait for the results of abandoned commands and drop them (their envs are free after)."""
        while self.discard():
            await self._wait_ready()
