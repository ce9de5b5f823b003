"""The process executor: envs in worker processes, results in shared memory.

```
  pool (event loop)                                worker process k (envs i..j)
  ─────────────────                                ────────────────────────────
  write actions ──► shared arena (memfd) ◄── read actions, write results
  submit ─────────► pipe: Command(env_indices) ──► runner.execute(command)
  loop.add_reader ◄ pipe: [Completion, ...]   ◄─── (small: flags, infos, errors)
  loop.add_reader ◄ process sentinel: death ─────► EnvCrashedError for its envs
```

Workers fork from :mod:`aenvs._zygote`, which has already imported the worker module
(numpy and gymnasium, not torch) and unpickled the env factories, so N workers start
in a fraction of one interpreter launch. Env factories travel with cloudpickle, so
lambdas and closures work. Nothing global changes in the pool's process (no start
method is set). Workers ignore SIGINT and die with the zygote, which dies with the
pool's process. A worker's death shows as EOF on its pipe and on its pidfd at once.
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
from multiprocessing import reduction
from multiprocessing.connection import Connection
from typing import Any

from aenvs._buffers import Buffers
from aenvs._commands import Command, CommandKind, unpack
from aenvs._errors import EnvCrashedError
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


class _Worker:
    def __init__(self, index: int, env_indices: list[int]) -> None:
        self.index = index
        self.env_indices = env_indices
        self.pid = 0
        self.pidfd = -1
        self.conn: Connection | None = None
        self.in_flight: dict[int, CommandKind] = {}
        self.sent_at: deque[float] = deque()  # when each command it has not answered went out
        self.alive = True
        self.built: asyncio.Future[Any] | None = None
        self.exited: asyncio.Future[None] | None = None
        # a plain command of each kind to all its envs, pickled once: a lockstep loop sends it every step
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
        # starting processes blocks (the forkserver's first start imports modules): off the loop
        await asyncio.to_thread(self._spawn, workers)
        for worker in workers:
            assert worker.conn is not None
            worker.built = loop.create_future()
            worker.exited = loop.create_future()
            self._watch(worker.conn.fileno(), self._on_readable, worker)
            # uvloop makes watched fds non-blocking; Connection needs blocking ones for
            # messages larger than the socket buffer (a reader only runs once data is there)
            os.set_blocking(worker.conn.fileno(), True)
            if worker.pidfd >= 0:
                self._watch(worker.pidfd, self._on_exit, worker)
        results = await self._await_built([(w.env_indices, w.built) for w in workers if w.built])
        specs_by_env: dict[int, EnvSpec] = {}
        for result in results:
            specs_by_env.update(result)
        return specs_by_env

    def _serve(self, workers: list[_Worker]) -> None:
        """Send built workers every env's spec and the arena's descriptor: they start serving."""
        arena = self._arena
        assert arena is not None
        for worker in workers:
            assert worker.conn is not None
            worker.conn.send_bytes(_dumps((self._specs, arena.size, self.close_timeout, self._spin.window)))
            reduction.send_handle(worker.conn, arena.fd, worker.pid)

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
            worker.conn = Connection(ours.detach())
            if hasattr(os, "pidfd_open"):
                with contextlib.suppress(OSError):
                    worker.pidfd = os.pidfd_open(worker.pid)

    # -- completions --------------------------------------------------------------------

    def _on_readable(self, worker: _Worker) -> None:
        conn = worker.conn
        if conn is None:
            return
        # One message per call: the loop calls again while the pipe stays readable, so no
        # extra poll() syscalls; the fd is blocking, so a message that is still arriving is
        # read whole.
        try:
            message = pickle.loads(conn.recv_bytes())
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
        except (EOFError, OSError):
            self._lost(worker)
        except Exception as exc:  # a message we cannot read: the worker cannot be trusted any more
            self._stop(worker, f"sent a message that could not be read ({exc!r})")

    def _on_exit(self, worker: _Worker) -> None:
        conn = worker.conn
        while worker.alive and conn is not None and not conn.closed and conn.poll():
            self._on_readable(worker)  # what it sent before dying is not lost
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
        for fd in [fd for fd, (_, owner) in self._watched.items() if owner is worker]:
            del self._watched[fd]
            self._poller.unregister(fd)
            if loop is not None and not loop.is_closed():
                loop.remove_reader(fd)

    def wait_outside_loop(self, timeout: float) -> None:
        """Read the workers' pipes and pidfds here, as the loop's readers do, until what
        arrived wakes a waiter (see ``_wakes_a_waiter``) or ``timeout`` seconds pass; at
        once if no command is in flight."""
        deadline = time.perf_counter() + timeout
        watched, poll = self._watched, self._poller.poll
        spin: SpinWait | None = self._spin  # the first wait polls before it sleeps
        while not self._wakes_a_waiter() and any(w.in_flight for w in self._workers):
            left = deadline - time.perf_counter()
            if left <= 0:
                return
            ready = spin.poll(poll, deadline) if spin is not None else []
            spin = None
            for fd, _ in ready or poll(left * 1e3):
                if fd in watched:
                    callback, worker = watched[fd]
                    callback(worker)

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
            assert worker.conn is not None
            message = worker.pickled.get(kind) if same else None
            if message is None:
                message = _dumps(part)
                if same:
                    worker.pickled[kind] = message
            try:
                worker.conn.send_bytes(message)
            except OSError:
                pass  # the worker died: its pidfd / pipe EOF reports the envs in flight
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
        """Close what the parent holds of a dead worker (its pipe and pidfd)."""
        self._unwatch(worker)
        if worker.conn is not None:
            worker.conn.close()
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
                if worker.alive and worker.conn is not None:
                    try:
                        worker.conn.send_bytes(_dumps(None))
                    except OSError:
                        pass
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
