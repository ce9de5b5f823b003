"""Waiting for a pipe's next message by polling it for a short while before sleeping on it.

A process asleep in ``read`` or ``poll`` takes tens of microseconds to run again once the
message is there (on a virtual machine the idle CPU itself has to be woken), and a
lockstep loop pays that twice per batch: the pool's process waking its worker, the worker
waking the pool's process. Where the other side answers within a fraction of a
millisecond (fast envs, a training loop that sends again at once), polling for that long
saves both wake-ups; between polls the CPU goes to any other runnable thread
(``sched_yield``), so a spinning process slows no one that has work. Whoever spins stops
after its window and sleeps as before, and stops spinning at all while the other side
keeps it waiting much longer than the window (slow envs, a policy on a GPU).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

__all__ = ["DEFAULT_SPIN_WAIT", "SpinWait"]

DEFAULT_SPIN_WAIT = 0.0003
"""Seconds a process executor's pool and workers poll for the other's next message."""

_WORTH_IT = 10
"""Spin while the waits last at most this many windows: a wait a little longer than the
window still ends sooner after a spin (a side that spins answers sooner too), and the
polling costs at most a tenth of the waiting time."""

Poll = Callable[[float], list[tuple[int, int]]]
"""``select.poll().poll``: the ready ``(fd, events)``, within a timeout in milliseconds."""


class SpinWait:
    """Polls for up to ``window`` seconds before a caller sleeps, while the waits it is told
    of last at most a few windows.

    Example:
        >>> import select, socket
        >>> a, b = socket.socketpair()
        >>> poller = select.poll()
        >>> poller.register(b.fileno(), select.POLLIN)
        >>> spin = SpinWait(0.001)
        >>> spin.poll(poller.poll)  # nothing came within a millisecond
        []
        >>> _ = a.send(b"x")
        >>> [fd for fd, _ in spin.poll(poller.poll)] == [b.fileno()]
        True
        >>> spin.record(0.5)  # the other side took half a second: sleep at once next time
        >>> spin.worth
        False
        >>> a.close(), b.close()
        (None, None)
    """

    __slots__ = ("window", "worth")

    def __init__(self, window: float) -> None:
        if window < 0:
            raise ValueError(f"spin_wait must be >= 0 seconds, got {window!r}")
        self.window = window
        self.worth = window > 0
        """Whether the last wait was short enough for polling to pay."""

    def poll(self, poll: Poll, deadline: float | None = None) -> list[tuple[int, int]]:
        """``poll(0)`` until it reports a ready fd or the window (or ``deadline``, a
        ``time.perf_counter()`` time, if sooner) is over; what it reported, or ``[]``.
        At once (one ``poll(0)``) while spinning is not :attr:`worth` it."""
        ready = poll(0)
        if ready or not self.worth:
            return ready
        end = time.perf_counter() + self.window
        if deadline is not None and deadline < end:
            end = deadline
        while time.perf_counter() < end:
            os.sched_yield()
            ready = poll(0)
            if ready:
                return ready
        return ready

    def record(self, waited: float) -> None:
        """The last wait took ``waited`` seconds: spin next time only if that was not much
        longer than the window."""
        self.worth = self.window > 0 and waited <= _WORTH_IT * self.window
