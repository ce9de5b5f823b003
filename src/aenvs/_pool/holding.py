"""A loop holding a pool (a running :func:`aenvs.collect`), and what other callers' calls do about it.

A collector sends and receives on the pool between the items it hands out, and keeps
results it has not handed out yet. Another caller's call on the pool meanwhile (a
``pool.reset()`` after a ``break``, a ``get_attr`` inside the loop) must neither meet busy
envs nor take the collector's results. So every send, receive and call asks the holder
first, unless it is the holder's own (told apart by a context variable its tasks carry):

- a call that sends or receives (steps, resets, receives, seeding) takes the pool back: the
  holder receives what it has in flight, keeps it, and stops (:meth:`PoolHolder.yield_pool`);
- ``call``, ``get_attr`` and ``set_attr`` visit: the holder pauses around them, then goes on.

Nothing here waits on garbage collection: a holder is released when it stops.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import AsyncGenerator
from typing import Protocol

__all__ = ["Holding", "PoolHolder", "acting_context"]


class PoolHolder(Protocol):
    """What a loop holding a pool does when another caller needs it."""

    async def yield_pool(self, *, visit: bool) -> None:
        """Another caller's call is about to run: wait until nothing the holder sent is in
        flight (its results received and kept). For a ``visit``, send nothing more until
        :meth:`resume`; otherwise stop and release the pool. Raise
        :class:`~aenvs.EnvBusyError` instead where the holder is in use and the call is not
        a visit."""
        ...

    def resume(self) -> None:
        """The visiting call is over: the holder may send again."""
        ...

    def yield_now(self, *, closing: bool) -> None:
        """Stop at once, from synchronous code, and release the pool: what is in flight is
        abandoned (``closing``: the pool closes; raise nothing). Without ``closing`` it may
        raise :class:`~aenvs.EnvBusyError` where the holder is in use."""
        ...


_acting: contextvars.ContextVar[PoolHolder | None] = contextvars.ContextVar("aenvs_pool_holder", default=None)


def acting_context(holder: PoolHolder) -> contextvars.Context:
    """A copy of the current context in which pool calls are ``holder``'s own: run its tasks
    in it (``loop.create_task(coro, context=...)``; the tasks they create inherit it).

    A task of its own, rather than the variable set and reset around an await: a coroutine
    may start outside a task and carry on in one (the sync shim's first step), where the
    reset would meet another context.

    Example:
        >>> holding = Holding()
        >>> class Loop:
        ...     async def yield_pool(self, *, visit: bool) -> None: ...
        ...     def resume(self) -> None: ...
        ...     def yield_now(self, *, closing: bool) -> None: ...
        >>> holding.holder = loop = Loop()
        >>> acting_context(loop).run(holding.is_others), holding.is_others()
        (False, True)
    """
    context = contextvars.copy_context()
    context.run(_acting.set, holder)
    return context


class Holding:
    """Which loop holds a pool (``holder``, None when none does), and the asking.

    Example:
        >>> import asyncio
        >>> class Loop:
        ...     async def yield_pool(self, *, visit: bool) -> None:
        ...         print("yield, visit:", visit)
        ...     def resume(self) -> None:
        ...         print("resume")
        ...     def yield_now(self, *, closing: bool) -> None: ...
        >>> holding = Holding()
        >>> holding.holder = Loop()
        >>> async def main() -> None:
        ...     async with holding.visit():
        ...         pass
        ...     await holding.claim()
        >>> asyncio.run(main())
        yield, visit: True
        resume
        yield, visit: False
        >>> holding.holder is None
        True
    """

    __slots__ = ("holder",)

    def __init__(self) -> None:
        self.holder: PoolHolder | None = None

    def is_others(self) -> bool:
        """Whether a loop holds the pool and the running code is not acting for it."""
        holder = self.holder
        return holder is not None and _acting.get() is not holder

    async def claim(self) -> None:
        """Before a call that sends or receives: the holder (not the caller's) stops, or raises."""
        holder = self.holder
        if holder is not None and _acting.get() is not holder:
            await holder.yield_pool(visit=False)
            if self.holder is holder:
                self.holder = None

    def claim_now(self) -> None:
        """:meth:`claim` from synchronous code: the holder stops at once (what it has in
        flight is abandoned), or raises."""
        holder = self.holder
        if holder is not None and _acting.get() is not holder:
            holder.yield_now(closing=False)
            if self.holder is holder:
                self.holder = None

    def closing(self) -> None:
        """The pool closes: the holder stops, and the pool is held no more."""
        holder, self.holder = self.holder, None
        if holder is not None:
            holder.yield_now(closing=True)

    @contextlib.asynccontextmanager
    async def visit(self) -> AsyncGenerator[None]:
        """Around a call that only visits the envs (``call``, ``get_attr``, ``set_attr``): the
        holder (not the caller's) pauses, its commands in flight received first."""
        holder = self.holder
        if holder is None or _acting.get() is holder:
            yield
            return
        await holder.yield_pool(visit=True)
        try:
            yield
        finally:
            holder.resume()
