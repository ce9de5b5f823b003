"""Loop drivers: run coroutines of the async core from synchronous code.

The sync shim (:mod:`aenvs._sync`) holds one driver for its lifetime, because its
pool is bound to the event loop it started on.

- :class:`PrivateLoop` (the default): a loop owned by the driver, run in the caller's
  thread with ``run_until_complete`` (see :func:`new_event_loop` for which loop: uvloop,
  except in the main thread where asyncio's is cheaper a call). Between calls the loop
  is idle; executors keep working meanwhile (thread workers queue their results with
  ``call_soon_threadsafe``, process results wait in their pipes) and are picked up by
  the next call. Ctrl-C during a call cancels the coroutine at its next await and
  raises ``KeyboardInterrupt`` once; a second Ctrl-C in the same call raises at once.
  The SIGINT handler is installed once per process (``asyncio.Runner`` reinstalls
  one around every call) and hands over to the previous handler whenever no
  call is running.
- :class:`PortalLoop`: a loop in a background thread (anyio's blocking portal), for
  callers whose thread already runs a loop (Jupyter, an async app), where
  ``run_until_complete`` is not allowed. Ctrl-C in the caller cancels the coroutine too.

:func:`make_driver` picks one: the portal when the calling thread runs a loop, else
the private loop.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import contextlib
import importlib
import signal
import threading
import warnings
import weakref
from collections.abc import Callable, Coroutine, Generator
from types import FrameType
from typing import Any, ClassVar, Literal, Protocol, TypeVar, cast

import anyio.from_thread

from aenvs._cancellation import clear_interrupt, request_interrupt

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop is a dependency where it installs
    uvloop = None

__all__ = [
    "DriverKind",
    "Killable",
    "LoopDriver",
    "PortalLoop",
    "PrivateLoop",
    "kill_dropped",
    "make_driver",
    "new_event_loop",
]

T = TypeVar("T")
DriverKind = Literal["auto", "private", "portal"]

_CLEANUP_TIMEOUT = 10.0  # seconds an interrupted coroutine gets to finish its cancellation
_WAIT_OUTSIDE = 0.005  # seconds a call waits outside the loop before the loop takes over


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new event loop for a private driver: the cheapest per ``run_until_complete`` here.

    uvloop where installed, except in the main thread: there, uvloop creates and closes
    a socketpair for signal wake-ups on every ``run_until_complete``, and the sync shim
    makes one such call per method; the pool's own work costs the same on both loops.
    """
    if uvloop is not None and threading.current_thread() is not threading.main_thread():
        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def _future(awaited: object) -> asyncio.Future[object] | None:
    """What a coroutine yielded, if it is a future (what ``await future`` yields)."""
    return cast("asyncio.Future[object]", awaited) if isinstance(awaited, asyncio.Future) else None


def _loop_running_here() -> bool:
    return asyncio._get_running_loop() is not None


class LoopDriver(abc.ABC):
    """Runs coroutine functions to completion from synchronous code, always on the same loop.

    Example:
        >>> driver = make_driver()
        >>> async def add(a, b):
        ...     return a + b
        >>> driver.run(add, 1, 2)
        3
        >>> driver.close()
    """

    kind: ClassVar[str]

    @abc.abstractmethod
    def run(self, fn: Callable[..., Coroutine[Any, Any, T]], /, *args: Any, **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` on the driver's loop and return its result."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the loop (and its thread). Idempotent."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool: ...


# -- the private loop ---------------------------------------------------------------------


class _Call:
    """One sync call in progress on a private loop in the main thread (what SIGINT cancels).

    ``task`` is None while the call runs its first step outside the loop; a Ctrl-C then is
    raised once that step is over (the pool is never left halfway through a step).
    """

    __slots__ = ("interrupted", "loop", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any] | None) -> None:
        self.loop = loop
        self.task = task
        self.interrupted = False


_current: _Call | None = None  # the call running in the main thread, if any
_previous_handler: Any = None  # the SIGINT handler ours replaced


def _noop() -> None:
    pass


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    call = _current
    if call is None:  # no sync call running: whoever handled SIGINT before us does
        handler = _previous_handler
        if callable(handler):
            handler(signum, frame)
        elif handler != signal.SIG_IGN:
            raise KeyboardInterrupt
        return
    if call.interrupted:  # a second Ctrl-C: do not wait for the next await
        raise KeyboardInterrupt
    call.interrupted = True
    if call.task is None:  # the first step, outside the loop: the pool yields at its next await
        request_interrupt()
    elif not call.task.done():
        call.task.cancel()
        call.loop.call_soon_threadsafe(_noop)  # wake the loop if it waits in select()


# signal.getsignal turns the handler into an enum member where it can, through a ValueError
# for every handler that is a function (once per sync call): the C function it calls first
# answers the same for the handlers compared here
_getsignal: Callable[[int], Any] = getattr(importlib.import_module("_signal"), "getsignal", signal.getsignal)


def _install_sigint_handler() -> bool:
    """Install our SIGINT handler if SIGINT is handled the default way; whether ours is in place."""
    global _previous_handler
    current = _getsignal(signal.SIGINT)
    if current is _on_sigint:
        return True
    if current is not signal.default_int_handler:
        return False  # someone else's handler: leave it alone (it decides what Ctrl-C does)
    _previous_handler = current
    signal.signal(signal.SIGINT, _on_sigint)
    return True


class PrivateLoop(LoopDriver):
    """A loop owned by the driver and run in the caller's thread.

    Args:
        loop_factory: makes the loop (default: uvloop's where installed).
        wait_outside: the pool's executor's ``wait_outside_loop``: a call that waits for
            results the executor reads itself (the process executor's pipes) waits in it,
            without a turn of the loop, for up to a few milliseconds; the loop takes over
            after that, or at once for anything else (timers, threads' results).

    A call made while the caller's thread runs another loop (from a coroutine) runs
    the private loop in a helper thread instead, blocking the caller until it is done.
    """

    kind = "private"

    def __init__(
        self,
        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
        wait_outside: Callable[[float], None] | None = None,
    ) -> None:
        self._loop: asyncio.AbstractEventLoop | None = (loop_factory or new_event_loop)()
        self._helper: concurrent.futures.ThreadPoolExecutor | None = None
        self._main_ident = threading.main_thread().ident
        self._wait_outside = wait_outside

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("this loop driver is closed")
        return self._loop

    @property
    def closed(self) -> bool:
        return self._loop is None

    def run(self, fn: Callable[..., Coroutine[Any, Any, T]], /, *args: Any, **kwargs: Any) -> T:
        global _current
        loop = self.loop
        if _loop_running_here():
            return self._run_in_helper(loop, fn, args, kwargs)
        if loop.is_running():
            raise RuntimeError(
                "this env is already running a call (from another thread, or from a policy or "
                "callback inside one of its own calls); the sync API is not reentrant"
            )
        call = outer = None
        if threading.get_ident() == self._main_ident and _install_sigint_handler():
            call, outer = _Call(loop, None), _current
            _current = call
        try:
            result = self._run(loop, fn(*args, **kwargs), call)
        finally:
            if call is not None:
                _current = outer
                clear_interrupt()
        if call is not None and call.interrupted:  # Ctrl-C arrived once the coroutine had finished
            raise KeyboardInterrupt
        return result

    def _run(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], call: _Call | None) -> T:
        # The coroutine's first step runs right here, with the loop marked as running so
        # the code finds it: a call that never waits (a whole-batch step of plain envs on
        # the inline executor) ends here without a turn of the loop, which costs more
        # than the pool's own work for such a step (~40 us). A call that waits carries on
        # in a task from where it stopped.
        asyncio._set_running_loop(loop)
        try:
            awaited = coro.send(None)
            if self._wait_outside is not None:
                awaited = self._carry_on_outside(coro, awaited, self._wait_outside, call)
            if call is not None and call.interrupted:  # Ctrl-C during that step: cancel it where it waits
                awaited = coro.throw(asyncio.CancelledError())
        except StopIteration as stop:
            return stop.value
        except asyncio.CancelledError:
            if call is not None and call.interrupted:
                raise KeyboardInterrupt from None
            raise
        finally:
            asyncio._set_running_loop(None)
        task = loop.create_task(_carry_on(coro, awaited))
        if call is not None:
            call.task = task
            if call.interrupted:  # Ctrl-C after the first step, before the task was recorded
                task.cancel()
        try:
            return loop.run_until_complete(task)
        except asyncio.CancelledError:
            if call is not None and call.interrupted:
                raise KeyboardInterrupt from None
            raise
        except BaseException:
            self._finish(loop, task)  # e.g. a KeyboardInterrupt raised inside the loop: let the task clean up
            raise

    @staticmethod
    def _carry_on_outside(
        coro: Coroutine[Any, Any, Any], awaited: object, wait: Callable[[float], None], call: _Call | None
    ) -> object:
        """Carry on ``coro`` outside the loop while what it awaits is done by ``wait`` (the
        executor reading its workers' pipes in this thread) within a short while; what it
        awaits then. Anything else it awaits (a timer, a thread's result) is the loop's."""
        future = _future(awaited)
        while future is not None and not (call is not None and call.interrupted):
            if not future.done():
                try:
                    wait(_WAIT_OUTSIDE)
                except BaseException:
                    coro.close()
                    raise
                if not future.done():
                    break
            awaited = coro.send(None)
            future = _future(awaited)
        return awaited

    @staticmethod
    def _finish(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
        if task.done() or loop.is_closed():
            return
        task.cancel()
        with contextlib.suppress(BaseException):
            loop.run_until_complete(asyncio.wait([task], timeout=_CLEANUP_TIMEOUT))

    def _run_in_helper(
        self,
        loop: asyncio.AbstractEventLoop,
        fn: Callable[..., Coroutine[Any, Any, T]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> T:
        if self._helper is None:
            self._helper = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="aenvs-loop")

        def run() -> T:
            return loop.run_until_complete(fn(*args, **kwargs))

        return self._helper.submit(run).result()

    def close(self) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            if not loop.is_running() and not _loop_running_here():
                loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            if not loop.is_running():
                loop.close()
            if self._helper is not None:
                self._helper.shutdown(wait=True)
                self._helper = None


class _Suspended:
    """Awaitable that carries on a coroutine already suspended on ``awaited`` (what it
    yielded): ``await _Suspended(coro, awaited)`` is ``await coro`` from that point on."""

    __slots__ = ("awaited", "coro")

    def __init__(self, coro: Coroutine[Any, Any, Any], awaited: Any) -> None:
        self.coro = coro
        self.awaited = awaited

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, awaited = self.coro, self.awaited
        while True:
            try:
                sent = yield awaited
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # thrown in by the task: cancellation, mostly
                try:
                    awaited = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    awaited = coro.send(sent)
                except StopIteration as stop:
                    return stop.value


async def _carry_on(coro: Coroutine[Any, Any, T], awaited: Any) -> T:
    return await _Suspended(coro, awaited)


# -- the portal loop ----------------------------------------------------------------------


class PortalLoop(LoopDriver):
    """A loop in a background thread (anyio's blocking portal); calls block the caller.

    Args:
        use_uvloop: run uvloop in the portal (where installed).
    """

    kind = "portal"

    def __init__(self, use_uvloop: bool = True) -> None:
        options = {"use_uvloop": bool(use_uvloop and uvloop is not None)}
        self._cm: contextlib.AbstractContextManager[anyio.from_thread.BlockingPortal] | None = (
            anyio.from_thread.start_blocking_portal("asyncio", options, name="aenvs-portal")
        )
        self._portal: anyio.from_thread.BlockingPortal | None = self._cm.__enter__()
        _OPEN_PORTALS.add(self)

    @property
    def closed(self) -> bool:
        return self._portal is None

    def run(self, fn: Callable[..., Coroutine[Any, Any, T]], /, *args: Any, **kwargs: Any) -> T:
        portal = self._portal
        if portal is None:
            raise RuntimeError("this loop driver is closed")
        finished = threading.Event()

        async def call() -> T:
            try:
                return await fn(*args, **kwargs)
            finally:
                finished.set()

        future = portal.start_task_soon(call)
        try:
            return future.result()
        except KeyboardInterrupt:
            future.cancel()  # cancels the task in the portal at its next await
            finished.wait(_CLEANUP_TIMEOUT)
            raise

    def close(self) -> None:
        cm, self._cm, self._portal = self._cm, None, None
        _OPEN_PORTALS.discard(self)
        if cm is not None:
            cm.__exit__(None, None, None)


# Portals still open when the interpreter exits are closed before it stops its threads: a
# shim left open (say, held by the traceback of a failing script) is otherwise collected
# after the portal's thread is gone, and stopping that thread's loop then waits forever.
_OPEN_PORTALS: weakref.WeakSet[PortalLoop] = weakref.WeakSet()


def _close_open_portals() -> None:
    for driver in list(_OPEN_PORTALS):
        with contextlib.suppress(Exception):
            driver.close()


# threading's own exit hooks run before it joins threads (atexit's run after): the portal's
# loop still runs here. concurrent.futures stops its workers the same way.
threading._register_atexit(_close_open_portals)  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]


def make_driver(
    kind: DriverKind = "auto",
    *,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
    wait_outside: Callable[[float], None] | None = None,
) -> LoopDriver:
    """A loop driver: ``"private"``, ``"portal"``, or ``"auto"`` (the portal when this thread runs a loop).
    ``loop_factory`` and ``wait_outside`` are the private loop's (see :class:`PrivateLoop`).

    Example:
        >>> driver = make_driver()  # from plain synchronous code
        >>> driver.kind
        'private'
        >>> driver.close()
    """
    if kind == "auto":
        kind = "portal" if _loop_running_here() else "private"
    if kind == "private":
        return PrivateLoop(loop_factory, wait_outside)
    if kind == "portal":
        return PortalLoop()
    raise ValueError(f"loop must be 'auto', 'private' or 'portal', got {kind!r}")


class Killable(Protocol):
    """What :func:`kill_dropped` needs of a pool."""

    @property
    def is_closed(self) -> bool: ...

    def kill(self) -> None: ...


def kill_dropped(owner: object, pool: Killable | None, driver: LoopDriver | None) -> None:
    """``__del__`` of an owner of a pool and its loop driver, dropped unclosed: kill the
    pool's workers and close the driver, then warn (after: with warnings as errors, a
    warning first would stop the clean-up)."""
    if driver is None:
        return
    pool_open = pool is not None and not pool.is_closed
    if driver.closed and not pool_open:  # closed by its owner
        return
    if pool is not None and pool_open:  # (a driver closed at exit leaves the pool to us)
        pool.kill()
    try:
        driver.close()
    except Exception:
        pass
    warnings.warn(f"{owner!r} was not closed; its workers were killed", ResourceWarning, stacklevel=2)
