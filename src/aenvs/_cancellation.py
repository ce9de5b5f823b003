"""Cancellation points for pool calls that can finish without ever suspending.

A cancellation (``task.cancel()``, a Ctrl-C turned into one) reaches a coroutine only
where it suspends. A pool call whose results are ready at once, such as a step of plain
envs on the inline executor, never suspends, so a loop of them (a ``rollout``) would
hold the cancellation until it ends. :func:`cancellation_requested` tells the pool that
a cancellation waits; the pool then yields to the loop once, at a point where nothing
has been taken, and the cancellation lands there as it would at any other await.
"""

from __future__ import annotations

import asyncio

__all__ = ["cancellation_requested", "clear_interrupt", "request_interrupt"]

_current_task = asyncio.current_task
_interrupted = False


def request_interrupt() -> None:
    """Note a Ctrl-C that arrived while a sync call ran outside a task (see :mod:`aenvs._loop`)."""
    global _interrupted
    _interrupted = True


def clear_interrupt() -> None:
    """The sync call that was interrupted is over."""
    global _interrupted
    _interrupted = False


def cancellation_requested() -> bool:
    """Whether the running task was cancelled and has not seen it yet, or a sync call was interrupted.

    Example:
        >>> async def main():
        ...     return cancellation_requested()
        >>> asyncio.run(main())
        False
    """
    if _interrupted:
        return True
    task = _current_task()
    # ``is True`` makes the private flag (a bool in both asyncio implementations) a typed bool
    return task is not None and task._must_cancel is True  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]
