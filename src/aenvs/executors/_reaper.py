"""Stopping worker processes that are given a last chance to close their envs.

A worker the pool gives up on (a command outlived its timeout, :meth:`kill`) gets
SIGTERM: its handler interrupts the command under way and closes the worker's envs
(``aenvs._worker``). A :class:`Reaper` then watches those processes from a daemon
thread and sends SIGKILL to any still running ``close_timeout`` later (an env stuck in C
code, a close that hangs, a worker ignoring SIGTERM). It holds pidfds of its own, so a
pid reused meanwhile is never signalled, and needs no event loop: ``kill`` may run
from a finalizer.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Sequence

__all__ = ["Reaper"]


class Reaper:
    """SIGTERM ``targets`` now (``(pid, pidfd)`` pairs), and SIGKILL those still alive
    ``grace`` seconds later. The pidfds are duplicated: the caller may close its own. A
    target without a pidfd (pidfd -1: a kernel without them) gets SIGKILL at once.

    Example:
        >>> import subprocess, sys
        >>> child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        >>> reaper = Reaper([(child.pid, os.pidfd_open(child.pid))], grace=5.0)
        >>> reaper.wait(10.0), child.wait(10.0)
        (True, -15)
    """

    def __init__(self, targets: Sequence[tuple[int, int]], grace: float) -> None:
        self._lock = threading.Lock()  # the descriptors are closed by the watcher, signalled by anyone
        self._fds: list[int] = []
        for pid, pidfd in targets:
            fd = _dup(pidfd)
            if fd >= 0:
                self._fds.append(fd)
            elif pid:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        self._send(signal.SIGTERM)
        self.done = threading.Event()
        self._deadline = time.monotonic() + grace
        if not self._fds:
            self.done.set()
            return
        try:
            if sys.is_finalizing():  # no new thread now: no last chance either
                raise RuntimeError("finalizing")
            threading.Thread(target=self._watch, name="aenvs-reaper", daemon=True).start()
        except RuntimeError:  # the interpreter is shutting down
            self._finish()

    def wait(self, timeout: float | None) -> bool:
        """Wait until every target exited or was killed; whether that happened within ``timeout``."""
        return self.done.wait(timeout)

    def kill_now(self) -> None:
        """SIGKILL every target still alive, at once (its grace is over)."""
        self._deadline = 0.0
        self._send(signal.SIGKILL)

    def _watch(self) -> None:
        poller = select.poll()
        for fd in self._fds:
            poller.register(fd, select.POLLIN)
        while self._fds:
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                break
            for fd, _ in poller.poll(min(remaining, 0.2) * 1000):  # readable: the process exited
                poller.unregister(fd)
                with self._lock:
                    self._fds.remove(fd)
                    os.close(fd)
        self._finish()

    def _finish(self) -> None:
        self._send(signal.SIGKILL)
        with self._lock:
            fds, self._fds = self._fds, []
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.done.set()

    def _send(self, signum: int) -> None:
        with self._lock:
            for fd in self._fds:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signum)


def _dup(pidfd: int) -> int:
    if pidfd < 0:
        return -1
    try:
        return os.dup(pidfd)
    except OSError:
        return -1
