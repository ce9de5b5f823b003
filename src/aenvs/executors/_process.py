"""The process executor: envs in worker processes, results in shared memory.

```
  pool (event loop)                                worker process k (envs i..j)
  ─────────────────                                ────────────────────────────
  write actions ──► shared arena (memfd) ◄── read actions, write results
  submit ─────────► socket: Command(env_indices) ──► runner.execute(command)
  loop.add_reader ◄ socket: [Completion, ...]   ◄─── (small: flags, infos, errors)
  loop.add_reader ◄ pidfd: death ──────────────────► EnvCrashedError for its envs
```

Workers fork from :mod:`aenvs._zygote`, which has already imported the worker module
(numpy and gymnasium, not torch) and unpickled the env factories, so N workers start
in a fraction of one interpreter launch. Env factories travel with cloudpickle, so
lambdas and closures work. Nothing global changes in the pool's process (no start
method is set). Workers ignore SIGINT and die with the zygote, which dies with the
pool's process. A worker's death shows as EOF on its socket and on its pidfd at once.

Nothing waits on a worker's socket on the loop's thread, whatever is sent: the pool's
end is non-blocking. A message goes out at once as far as the socket takes it; the rest
waits in the worker's outgoing buffer, which the loop writes as the socket drains
(``loop.add_writer``), and later messages queue behind it, so a burst of commands (a
reset per env) never blocks the loop while a worker is busy writing its answers back.
Answers are read as they arrive, a message that is still arriving kept until it is whole
(:class:`~aenvs._frames.FrameReader`), so the two directions drain independently.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import select
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aenvs._buffers import Buffers
from aenvs._commands import Command, CommandKind, unpack
from aenvs._errors import EnvCrashedError
from aenvs._frames import FrameReader, frame
from aenvs._shm import SharedArena
from aenvs._specs import EnvSpec
from aenvs._spinning import DEFAULT_SPIN_WAIT, SpinWait
from aenvs._zygote import fork_worker
from aenvs.executors._base import Capabilities
from aenvs.executors._pickling import cloudpickle_dumps
from aenvs.executors._reaper import Reaper
from aenvs.executors._workers import WorkerGroupExecutor

__all__ = ["ProcessExecutor"]


def _dumps(message: Any) -> bytes:
    try:
        return pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # lambdas and local classes in call arguments
        return cloudpickle_dumps(message)


_STOP = frame(_dumps(None))  # tells a worker to close its envs and exit


class _Worker:
    def __init__(self, index: int, env_indices: list[int]) -> None:
        self.index = index
        self.env_indices = env_indices
        self.pid = 0
        self.pidfd = -1
        self.sock: socket.socket | None = None  # non-blocking
        self.fd = -1  # the socket's
        self.reader: FrameReader | None = None
        self.out = bytearray()  # what its socket did not take yet, written as it drains
        self.in_flight: dict[int, CommandKind] = {}
        self.sent_at: deque[float] = deque()  # when each command it has not answered went out
        self.alive = True
        self.built: asyncio.Future[Any] | None = None
        self.exited: asyncio.Future[None] | None = None
        # a plain command of each kind to all its envs, framed once: a lockstep loop sends it every step
        self.pickled: dict[CommandKind, bytes] = {}

    def describe_death(self, why: str = "died") -> str:
        return f"worker process {self.index} (pid {self.pid}) hosting envs {self.env_indices} {why}"


class ProcessExecutor(WorkerGroupExecutor[_Worker]):
    """Runs envs in worker processes, several envs per worker, results in shared memory.

    Args:
        num_workers: worker processes (default: ``os.cpu_count()``, at most one per env).
        envs_per_worker: envs per worker instead (overrides ``num_workers``).
        startup_timeout: seconds for every worker to build its envs.
        close_timeout: seconds ``aclose`` waits for workers to stop before SIGTERM (on which a
            worker interrupts its command and closes its envs), and again before SIGKILL.
        spin_wait: seconds the pool polls for a worker's answer, and a worker for the
            pool's next command, before sleeping (a sleeping process takes tens of
            microseconds to wake); each side yields the CPU between polls, and stops polling
            while the other keeps it waiting more than ten times this. 0: always sleep.

    Example:
        >>> import asyncio
        >>> from aenvs import AsyncEnvPool
        >>> from aenvs.executors import ProcessExecutor
        >>> async def main():
        ...     executor = ProcessExecutor(num_workers=2)  # 8 envs, 4 in each worker process
        ...     async with AsyncEnvPool(["CartPole-v1"] * 8, executor=executor) as pool:
        ...         await pool.reset()
        ...         return len(executor.pids)
        >>> asyncio.run(main())
        2
    """

    name = "process"
    capabilities = Capabilities(abort=True, respawn=True, pickles_factories=True)
    packs_answers = True

    def __init__(
        self,
        *,
        num_workers: int | None = None,
        envs_per_worker: int | None = None,
        startup_timeout: float | None = 60.0,
        close_timeout: float = 5.0,
        spin_wait: float = DEFAULT_SPIN_WAIT,
    ) -> None:
        super().__init__(num_workers, envs_per_worker, startup_timeout, close_timeout)
        self._spin = SpinWait(spin_wait)
        self._spin_until = 0.0  # perf_counter time: the loop keeps polling until then
        self._spinning: asyncio.Handle | None = None
        self._arena: SharedArena | None = None  # its descriptor stays open for workers started later
        self._reapers: list[Reaper] = []  # workers given up on, closing their envs before a SIGKILL
        self._poller = select.poll()  # the fds the loop watches, for wait_outside_loop
        self._watched: dict[int, tuple[Callable[[_Worker], None], _Worker]] = {}
        self._writing: dict[int, _Worker] = {}  # by socket fd: the workers with bytes waiting to go out

    @property
    def pids(self) -> list[int]:
        """Process ids of the workers (for monitoring and fault injection)."""
        return [w.pid for w in self._workers if w.pid]

    # -- start ------------------------------------------------------------------------

    def _new_worker(self, index: int, env_indices: list[int]) -> _Worker:
        return _Worker(index, env_indices)

    def _default_workers(self, num_envs: int) -> int:
        return os.cpu_count() or 1

    def _allocate(self, specs: list[EnvSpec]) -> Buffers:
        self._arena = arena = SharedArena.create(specs)
        return arena.buffers

    async def _start_workers(self, workers: list[_Worker]) -> dict[int, EnvSpec]:
        loop = self._loop
        assert loop is not None
        # starting processes blocks (the forkserver's first start imports modules): off the loop.
        # A cancel (the pool closing during a restart) waits for the thread's forks to end, so
        # that every worker it started has its pid when the caller stops them
        spawning = asyncio.ensure_future(asyncio.to_thread(self._spawn, workers))
        try:
            await asyncio.shield(spawning)
        except asyncio.CancelledError:
            await asyncio.wait([spawning])
            raise
        for worker in workers:
            worker.built = loop.create_future()
            worker.exited = loop.create_future()
            self._watch(worker.fd, self._on_readable, worker)
            if worker.pidfd >= 0:
                self._watch(worker.pidfd, self._on_exit, worker)
        results = await self._await_built([(w.env_indices, w.built) for w in workers if w.built])
        specs_by_env: dict[int, EnvSpec] = {}
        for result in results:
            specs_by_env.update(result)
        return specs_by_env

    def _serve(self, workers: list[_Worker]) -> None:
        """Send built workers the arena's descriptor and every env's spec: they start serving."""
        arena = self._arena
        assert arena is not None
        specs = frame(_dumps((self._specs, arena.size, self.close_timeout, self._spin.window)))
        for worker in workers:
            if not worker.alive or worker.sock is None:
                continue
            try:
                # one byte carries the descriptor; it is the first thing ever written to this
                # socket, so the socket's empty buffer takes it at once
                socket.send_fds(worker.sock, [b"\0"], [arena.fd])
            except (BrokenPipeError, ConnectionResetError):
                continue  # the worker died: its pidfd / socket EOF reports it
            except OSError as exc:
                self._stop(worker, f"could not be handed the shared memory ({exc!r})")
                continue
            self._send(worker, specs)

    def _spawn(self, workers: list[_Worker]) -> None:
        for worker in workers:
            ours, theirs = socket.socketpair()
            try:
                worker.pid = fork_worker(
                    self._recipe_of(worker), worker.index, len(self._recipe[0]), theirs.fileno()
                )
            except BaseException:
                ours.close()
                raise
            finally:
                theirs.close()
            ours.setblocking(False)
            worker.sock, worker.fd, worker.reader = ours, ours.fileno(), FrameReader(ours)
            if hasattr(os, "pidfd_open"):
                with contextlib.suppress(OSError):
                    worker.pidfd = os.pidfd_open(worker.pid)

    # -- completions --------------------------------------------------------------------

    def _on_readable(self, worker: _Worker) -> None:
        reader = worker.reader
        if reader is None or not worker.alive:
            return
        # One read per call (the loop calls again while the socket stays readable, so no
        # extra syscall to find it empty); whatever it completes is handled now, and a
        # message still arriving waits in the reader.
        try:
            if not reader.receive():
                self._lost(worker)
                return
        except BlockingIOError:
            return
        except OSError:
            self._lost(worker)
            return
        self._handle_frames(worker, reader)

    def _handle_frames(self, worker: _Worker, reader: FrameReader) -> None:
        """Handle every message ``reader`` holds whole, in order, while ``worker`` is trusted."""
        while worker.alive and (data := reader.next()) is not None:
            try:
                self._handle(worker, pickle.loads(data))
            except Exception as exc:  # a message we cannot read: the worker cannot be trusted any more
                self._stop(worker, f"sent a message that could not be read ({exc!r})")

    def _handle(self, worker: _Worker, message: Any) -> None:
        if worker.built is not None and not worker.built.done():
            tag, value = message
            if tag == "built":
                worker.built.set_result(value)
            else:
                worker.built.set_exception(value)
            return
        in_flight = worker.in_flight
        if worker.sent_at:  # one answer per command, in order
            self._spin.record(time.perf_counter() - worker.sent_at.popleft())
        if type(message) is tuple:  # plain answers, packed: held whole (see run_whole)
            for i in message[1]:  # pyright: ignore[reportUnknownVariableType]
                in_flight.pop(i, None)  # pyright: ignore[reportUnknownArgumentType]
            self._push_packed(message)  # pyright: ignore[reportUnknownArgumentType]
            return
        completions = unpack(message)
        for completion in completions:
            in_flight.pop(completion.env_index, None)
        self._push(completions)

    def _on_exit(self, worker: _Worker) -> None:
        reader = worker.reader
        while worker.alive and reader is not None:  # what it sent before dying is not lost
            try:
                if not reader.receive():
                    break
            except OSError:  # BlockingIOError: a process it started holds the socket open
                break
            self._handle_frames(worker, reader)
        self._lost(worker)

    def _lost(self, worker: _Worker, why: str = "died") -> None:
        if not worker.alive:
            return
        worker.alive = False
        self._unwatch(worker)
        description = worker.describe_death(why)
        if worker.built is not None and not worker.built.done():
            first = worker.env_indices[0]
            worker.built.set_exception(EnvCrashedError(first, "make", f"EnvCrashedError: {description}\n"))
        if worker.exited is not None and not worker.exited.done():
            worker.exited.set_result(None)
        self._crash_in_flight(worker, why)

    def _describe(self, worker: _Worker, why: str) -> str:
        return worker.describe_death(why)

    def _stop(self, worker: _Worker, why: str) -> None:
        # SIGTERM: the worker interrupts its command and closes its envs; SIGKILL after close_timeout
        self._reap([worker], self.close_timeout)
        self._lost(worker, why)

    def _reap(self, workers: list[_Worker], grace: float) -> None:
        self._reapers = [r for r in self._reapers if not r.done.is_set()]
        targets = [(w.pid, w.pidfd) for w in workers if w.pid]
        if targets:
            self._reapers.append(Reaper(targets, grace))

    def _watch(self, fd: int, callback: Callable[[_Worker], None], worker: _Worker) -> None:
        assert self._loop is not None
        self._loop.add_reader(fd, callback, worker)
        self._poller.register(fd, select.POLLIN)
        self._watched[fd] = (callback, worker)

    def _unwatch(self, worker: _Worker) -> None:
        loop = self._loop
        self._stop_writing(worker)
        worker.out.clear()  # nothing more goes to it
        for fd in [fd for fd, (_, owner) in self._watched.items() if owner is worker]:
            del self._watched[fd]
            self._poller.unregister(fd)
            if loop is not None and not loop.is_closed():
                loop.remove_reader(fd)

    def wait_outside_loop(self, timeout: float) -> None:
        """Read the workers' sockets and pidfds here, and write what waits to go out, as the
        loop's readers and writers do, until what arrived wakes a waiter (see
        ``_wakes_a_waiter``) or ``timeout`` seconds pass; at once if no command is in flight."""
        deadline = time.perf_counter() + timeout
        watched, writing, poll = self._watched, self._writing, self._poller.poll
        spin: SpinWait | None = self._spin  # the first wait polls before it sleeps
        while not self._wakes_a_waiter() and any(w.in_flight for w in self._workers):
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            ready = spin.poll(poll, deadline) if spin is not None else []
            spin = None
            for fd, events in ready or poll(left * 1e3):
                if events & select.POLLOUT and fd in writing:
                    self._on_writable(writing[fd])
                if events & ~select.POLLOUT and fd in watched:  # in, or the other end closed
                    callback, worker = watched[fd]
                    callback(worker)

    # -- writing ------------------------------------------------------------------------------

    def _send(self, worker: _Worker, data: bytes) -> None:
        """Write ``data`` (framed) to ``worker``: now, as far as its socket takes it; the rest
        from the loop as the socket drains (:meth:`_on_writable`). Never waits."""
        out = worker.out
        if out:  # bytes before it are still waiting: it goes after them
            out += data
            return
        assert worker.sock is not None
        try:
            sent = worker.sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            return  # the worker died: its pidfd / socket EOF reports the envs in flight
        if sent < len(data):
            out += memoryview(data)[sent:]
            self._start_writing(worker)

    def _on_writable(self, worker: _Worker) -> None:
        out, sock = worker.out, worker.sock
        if not out or sock is None:
            self._stop_writing(worker)
            return
        try:
            sent = sock.send(out)
        except BlockingIOError:
            return
        except OSError:  # the worker died: nothing more goes to it (its EOF and pidfd report it)
            out.clear()
            self._stop_writing(worker)
            return
        del out[:sent]
        if not out:
            self._stop_writing(worker)

    def _start_writing(self, worker: _Worker) -> None:
        fd = worker.fd
        if fd in self._writing or fd not in self._watched:
            return
        self._writing[fd] = worker
        self._poller.modify(fd, select.POLLIN | select.POLLOUT)
        assert self._loop is not None
        self._loop.add_writer(fd, self._on_writable, worker)

    def _stop_writing(self, worker: _Worker) -> None:
        fd = worker.fd
        if self._writing.get(fd) is not worker:
            return
        del self._writing[fd]
        if fd in self._watched:
            self._poller.modify(fd, select.POLLIN)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.remove_writer(fd)

    # -- commands -------------------------------------------------------------------------

    def submit(self, command: Command) -> None:
        sent_at = time.perf_counter()
        kind = command.kind
        # to every env and nothing but a kind: each worker's part is the same every time
        same = command.is_plain() and command.env_indices == self._every_env
        for worker, part in self._split(command):
            worker.sent_at.append(sent_at)
            for i in part.env_indices:
                worker.in_flight[i] = kind
            message = worker.pickled.get(kind) if same else None
            if message is None:
                message = frame(_dumps(part))
                if same:
                    worker.pickled[kind] = message
            self._send(worker, message)
        self._keep_loop_polling(sent_at)

    def _keep_loop_polling(self, now: float) -> None:
        """Keep the loop from sleeping for the spin window after a command went out, while
        answers come within it: a callback that queues itself again makes each turn of
        the loop poll its fds without waiting, so the answer's reader runs without a
        wake-up, and other tasks run between turns as usual."""
        spin = self._spin
        if not spin.worth:
            return
        self._spin_until = now + spin.window
        loop = self._loop
        if self._spinning is None and loop is not None and not loop.is_closed():
            self._spinning = loop.call_soon(self._spin_turn)

    def _spin_turn(self) -> None:
        self._spinning = None
        loop = self._loop
        if (
            self._closing
            or loop is None
            or time.perf_counter() >= self._spin_until
            or not any(w.in_flight for w in self._workers)
        ):
            return
        os.sched_yield()  # the CPU to a runnable worker, if one waits for it
        self._spinning = loop.call_soon(self._spin_turn)

    # -- restarts ---------------------------------------------------------------------------

    def _successor(self, dead: _Worker) -> _Worker:
        self._release(dead)
        return super()._successor(dead)

    def _release(self, worker: _Worker) -> None:
        """Close what the parent holds of a dead worker (its socket and pidfd)."""
        self._unwatch(worker)
        if worker.sock is not None:
            worker.sock.close()
            worker.sock, worker.fd, worker.reader = None, -1, None
        if worker.pidfd >= 0:
            os.close(worker.pidfd)
            worker.pidfd = -1

    # -- closing ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Tell every worker to stop (it finishes its command, then closes its envs); after
        ``close_timeout``, SIGTERM those still running (the command is interrupted, the envs
        close); after ``close_timeout`` more, SIGKILL."""
        self._closing = True
        try:
            for worker in self._workers:
                if worker.alive and worker.sock is not None:
                    self._send(worker, _STOP)
            await self._wait_exit(self.close_timeout)
            self._reap([w for w in self._workers if w.alive], self.close_timeout)
            # also the workers given up on before (a timeout), still closing their envs
            reapers = [r for r in self._reapers if not r.done.is_set()]
            if reapers:
                await asyncio.to_thread(_wait_all, reapers, self.close_timeout + 1.0)
        finally:
            self._kill(0.0)

    async def _wait_exit(self, timeout: float) -> None:
        pending = [
            w.exited for w in self._workers if w.alive and w.exited is not None and not w.exited.done()
        ]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    def kill(self) -> None:
        """SIGTERM every worker (each closes its envs), SIGKILL those still running
        ``close_timeout`` later (from a thread: this returns at once)."""
        self._kill(self.close_timeout)

    def _kill(self, grace: float) -> None:
        self._closing = True
        self._reap([w for w in self._workers if w.alive], grace)
        if not grace:
            for reaper in self._reapers:
                reaper.kill_now()
        for worker in self._workers:
            worker.alive = False
            self._release(worker)
        self._workers = []
        if self._arena is not None:
            self._arena.close_fd()
            self._arena = None


def _wait_all(reapers: list[Reaper], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for reaper in reapers:
        reaper.wait(max(0.0, deadline - time.monotonic()))
