"""The thread executor: plain envs on worker threads.

Each worker hosts ``envs_per_worker`` envs (one by default, so that envs blocking on
I/O or ``time.sleep`` overlap) and runs their commands one at a time, in the order
sent. The executor has one thread per worker. By default the threads share one queue:
a command is queued on its worker, in the order sent, and the worker (once) on the
shared queue, where any free thread takes it and runs its queued commands in order. A
thread that has just answered often finds work waiting there, where a thread of its own
would have to be woken for it, and waking a thread is most of a fast hand-off's cost.
``pinned=True`` keeps each worker's envs on the thread that built them, for envs whose
state belongs to one thread.

On Linux the threads run under the ``SCHED_BATCH`` policy (``batch_scheduling``): a
thread whose env wakes up (its sleep ended, its socket answered) waits for the core's
next turn instead of preempting the event loop's thread, which feeds every env.

Completions reach the loop through ``call_soon_threadsafe``, coalesced so that a
burst of completions wakes the loop once; nothing polls. Threads are daemons: an
env stuck in a step cannot keep the interpreter from exiting.
"""

from __future__ import annotations

import asyncio
import os
import queue
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Final

from aenvs._commands import Command, CommandKind, Completion, RemoteError
from aenvs._env import EnvFn
from aenvs._runner import EnvRunner
from aenvs._specs import EnvSpec
from aenvs.executors._base import Capabilities
from aenvs.executors._workers import WorkerGroupExecutor

__all__ = ["ThreadExecutor"]

_STOP = None  # put in a queue to end the thread that takes it
_CLOSE: Final = "close"  # (shared queue) queued on a worker: close its envs, after its commands


class _Worker:
    def __init__(self, index: int, env_indices: list[int]) -> None:
        self.index = index
        self.env_indices = env_indices
        self.inbox: queue.SimpleQueue[Command | None] = queue.SimpleQueue()  # pinned: its thread's
        self.runner: EnvRunner | None = None
        # cleared (under the lock) when the pool gives up on this worker: it never answers again
        self.alive = True
        self.lock = threading.Lock()
        # set on the loop's thread, emptied by the worker's thread under the lock as it answers
        self.in_flight: dict[int, CommandKind] = {}
        self.exited: asyncio.Future[None] | None = None  # its first thread's end
        # shared queue: its commands in the order sent, run one at a time by the thread that
        # takes the worker from the shared queue; the worker is there (or being run) once
        self.queued: deque[Command | str] = deque()
        self.scheduled = False
        self.running_on: asyncio.Future[None] | None = None  # the thread running it (its end)
        self.closed = False  # its envs were closed (or are being closed): never again


class ThreadExecutor(WorkerGroupExecutor[_Worker]):
    """Runs envs on worker threads.

    Args:
        envs_per_worker: envs hosted by one worker (default 1: one thread per env).
        num_workers: number of workers (and threads) instead (envs spread evenly;
            envs_per_worker wins if both are given).
        startup_timeout: seconds for every thread to build its envs (None: unbounded).
        close_timeout: seconds ``aclose`` waits for threads to finish their command.
        pinned: run each worker's envs on the thread that built them, always (envs whose
            state belongs to one thread: a GL context, an sqlite connection made with
            ``check_same_thread``). By default any free thread runs a worker's next
            command, as ``asyncio.to_thread`` does: a worker's commands still run one at a
            time, in order, and the hand-offs cost less (docs/performance.md).
        batch_scheduling: on Linux, run the threads (and any thread their envs start)
            under the ``SCHED_BATCH`` policy: a thread woken by its env's I/O or sleep
            does not preempt the event loop's thread on its core. With many envs the
            loop's thread is the busiest one and every env waits for it, so it keeps
            more envs stepping (docs/performance.md). False: the default policy.

    Example:
        >>> import asyncio
        >>> from aenvs import AsyncEnvPool
        >>> from aenvs.executors import ThreadExecutor
        >>> async def main():
        ...     executor = ThreadExecutor(num_workers=2)  # 8 envs, 4 on each thread
        ...     async with AsyncEnvPool(["CartPole-v1"] * 8, executor=executor) as pool:
        ...         return (await pool.reset())["observation"].shape
        >>> asyncio.run(main())
        torch.Size([8, 4])
    """

    name = "thread"
    capabilities = Capabilities(abort=True, respawn=True)
    # A thread cannot be killed: it is abandoned (a daemon, counted in abandoned_threads)
    # and whatever it finishes later is dropped.
    _death = _abort_reason = "was abandoned: a command outlived its timeout"

    def __init__(
        self,
        *,
        envs_per_worker: int | None = None,
        num_workers: int | None = None,
        startup_timeout: float | None = None,
        close_timeout: float = 5.0,
        pinned: bool = False,
        batch_scheduling: bool = True,
    ) -> None:
        super().__init__(num_workers, envs_per_worker, startup_timeout, close_timeout)
        self.pinned = pinned
        self.batch_scheduling = batch_scheduling
        self._shared: queue.SimpleQueue[_Worker | None] = queue.SimpleQueue()  # workers to run
        self._threads: list[asyncio.Future[None]] = []  # every thread started, by its end
        # threads given up on (stuck in an env), with the worker they ran
        self._abandoned: list[tuple[_Worker, asyncio.Future[None]]] = []
        self._stopping = False

    # -- start ------------------------------------------------------------------------

    def _new_worker(self, index: int, env_indices: list[int]) -> _Worker:
        return _Worker(index, env_indices)

    async def _start_workers(self, workers: list[_Worker]) -> dict[int, EnvSpec]:
        runners: list[EnvRunner] = await self._await_built(
            [(w.env_indices, self._launch(w)) for w in workers]
        )
        specs_by_env: dict[int, EnvSpec] = {}
        for worker, runner in zip(workers, runners, strict=True):
            worker.runner = runner
            specs_by_env.update(runner.specs)
        return specs_by_env

    def _serve(self, workers: list[_Worker]) -> None:
        buffers = self.buffers
        assert buffers is not None
        for worker in workers:
            assert worker.runner is not None
            worker.runner.attach({i: buffers.rows(i) for i in worker.env_indices})

    async def _give_up(self) -> None:
        await self.aclose()

    def _launch(self, worker: _Worker) -> asyncio.Future[EnvRunner]:
        """Start ``worker``'s thread; the future resolves once its envs are built."""
        loop = self._loop
        assert loop is not None
        env_fns, seeds, make_kwargs = self._recipe
        ready: asyncio.Future[EnvRunner] = loop.create_future()
        exited: asyncio.Future[None] = loop.create_future()
        thread = threading.Thread(
            target=self._main,
            args=(
                worker,
                {i: env_fns[i] for i in worker.env_indices},
                len(env_fns),
                {i: seeds[i] for i in worker.env_indices},
                make_kwargs,
                ready,
                exited,
            ),
            name=f"aenvs-thread-{worker.index}",
            daemon=True,
        )
        worker.exited = exited
        self._threads.append(exited)
        thread.start()
        return ready

    def _main(
        self,
        worker: _Worker,
        env_fns: dict[int, EnvFn],
        num_envs: int,
        seeds: dict[int, int | None],
        make_kwargs: Mapping[int, Mapping[str, Any]],
        ready: asyncio.Future[EnvRunner],
        exited: asyncio.Future[None],
    ) -> None:
        loop = self._loop
        assert loop is not None
        if self.batch_scheduling:
            _yield_to_the_loop()
        runner: EnvRunner | None = None
        try:
            try:
                runner = EnvRunner.build(
                    env_fns,
                    num_envs=num_envs,
                    worker_index=worker.index,
                    seeds=seeds,
                    make_kwargs=make_kwargs,
                )
            except BaseException as exc:
                _resolve_threadsafe(loop, ready, exc)
                return
            runner.close_timeout = self.close_timeout
            _resolve_threadsafe(loop, ready, runner)
            if not self.pinned:
                # its envs are closed by whichever thread runs the worker's last command
                built, runner = runner, None
                if self._serve_shared(exited):
                    _close(worker, built, idle=True)  # (never served: the pool's start failed)
                return
            in_flight = worker.in_flight
            while (command := worker.inbox.get()) is not None:
                done = _execute(runner, command)
                with worker.lock:
                    if not worker.alive:
                        break
                    for c in done:
                        in_flight.pop(c.env_index, None)
                    self._push_threadsafe(done)
        finally:
            # also when the pool gave up on this thread: its env closes once its stuck step returns
            if runner is not None:
                runner.close()
            _resolve_threadsafe(loop, exited, None)

    def _serve_shared(self, exited: asyncio.Future[None]) -> bool:
        """Run the workers the shared queue hands this thread until a stop (True), or until
        the pool gave up on a worker this thread ran (False: its replacement brings a thread
        of its own)."""
        shared = self._shared
        while (worker := shared.get()) is not None:
            if not self._run_worker(worker, exited):
                return False
        return True

    def _run_worker(self, worker: _Worker, exited: asyncio.Future[None]) -> bool:
        """Run ``worker``'s queued commands in order until none is left (True); False when
        the pool gave up on the worker while this thread ran it (the thread ends)."""
        runner = worker.runner
        assert runner is not None
        in_flight, queued = worker.in_flight, worker.queued
        while True:
            with worker.lock:
                if not queued:
                    worker.scheduled = False
                    worker.running_on = None
                    return True
                command = queued.popleft()
                worker.running_on = exited
            if command is _CLOSE:
                _close(worker, runner)
                continue
            assert isinstance(command, Command)
            if not worker.alive:
                continue  # answered with a crash when the pool gave up on it
            done = _execute(runner, command)
            with worker.lock:
                if not worker.alive:  # given up on while this thread ran it
                    queued.clear()
                    worker.scheduled = False
                    worker.running_on = None
                    break
                for c in done:
                    in_flight.pop(c.env_index, None)
                self._push_threadsafe(done)
        _close(worker, runner)  # its envs close once its stuck command returns
        return False

    def _enqueue(self, worker: _Worker, item: Command | str) -> None:
        """Queue ``item`` on ``worker`` (shared queue), and the worker for a thread unless it
        is there or running already."""
        with worker.lock:
            worker.queued.append(item)
            if worker.scheduled:
                return
            worker.scheduled = True
        self._shared.put(worker)

    # -- commands -------------------------------------------------------------------------

    def submit(self, command: Command) -> None:
        kind, worker_of = command.kind, self._worker_of
        hand: Callable[[_Worker, Command], None] = self._hand_pinned if self.pinned else self._enqueue
        if len(self._workers) == len(worker_of):  # one env per worker: no splitting needed
            whole = len(command.env_indices) == 1
            for i in command.env_indices:
                worker = worker_of[i]
                if worker.alive:
                    worker.in_flight[i] = kind
                    hand(worker, command if whole else command.subset([i]))
                else:
                    self._answer_dead(worker, kind, [i])
            return
        for worker, part in self._split(command):
            in_flight = worker.in_flight
            for i in part.env_indices:
                in_flight[i] = kind
            hand(worker, part)

    @staticmethod
    def _hand_pinned(worker: _Worker, command: Command) -> None:
        worker.inbox.put(command)

    # -- restarts and closing ---------------------------------------------------------------

    def _describe(self, worker: _Worker, why: str) -> str:
        return f"thread {worker.index} hosting envs {worker.env_indices} {why}"

    def _stop(self, worker: _Worker, why: str) -> None:
        with worker.lock:
            if not worker.alive:
                return
            worker.alive = False
            stuck = worker.exited if self.pinned else worker.running_on
        if stuck is not None:
            self._abandoned.append((worker, stuck))
        if self.pinned:
            worker.inbox.put(_STOP)
        elif stuck is None and worker.runner is not None:
            if self._stopping:  # the threads may have ended: close its envs here
                _close(worker, worker.runner)
            else:
                self._enqueue(worker, _CLOSE)  # not running: a thread closes its envs
        self._flush_incoming()  # what it answered before being abandoned is delivered
        self._crash_in_flight(worker, why)

    async def aclose(self) -> None:
        self._stop_threads()
        # threads abandoned in a stuck env whose envs were restarted elsewhere are not
        # waited for: they may never finish
        replaced = {id(t) for w, t in self._abandoned if w not in self._workers}
        pending = [t for t in self._threads if not t.done() and id(t) not in replaced]
        if pending:
            await asyncio.wait(pending, timeout=self.close_timeout)
        self.kill()

    def kill(self) -> None:
        # Threads cannot be killed: a thread stuck in an env is a daemon, abandoned here.
        if sys.is_finalizing():
            # A daemon thread that held a worker's lock when the interpreter began to exit
            # is stopped for good where it next waits for the GIL, the lock still held: a
            # pool dropped until then (its __del__ runs now) must not wait for that lock.
            self._stopping = True
        else:
            self._stop_threads()
        self._workers = []

    def _stop_threads(self) -> None:
        """Ask every thread to close its envs and end, once the commands before are run."""
        if self._stopping:
            return
        self._stopping = True
        if self.pinned:
            for worker in self._workers:
                worker.inbox.put(_STOP)
            return
        for worker in self._workers:
            if worker.alive and worker.runner is not None:
                self._enqueue(worker, _CLOSE)
        for _ in self._threads:
            self._shared.put(_STOP)

    @property
    def abandoned_threads(self) -> int:
        """Threads still running although the executor gave up on them (stuck in an env)."""
        return len({id(t) for _, t in self._abandoned if not t.done()})

    def counters(self) -> dict[str, int]:
        return {"abandoned_threads": self.abandoned_threads}


_SCHED_BATCH: int | None = getattr(os, "SCHED_BATCH", None)  # Linux only


def _yield_to_the_loop() -> None:
    """Run the calling thread under ``SCHED_BATCH`` where there is one: no preempting a
    running thread (the event loop's) when it wakes."""
    if _SCHED_BATCH is None:
        return
    try:
        os.sched_setscheduler(0, _SCHED_BATCH, os.sched_param(0))  # 0: the calling thread
    except OSError:  # refused (a sandbox's seccomp filter): the default policy, as before
        pass


def _close(worker: _Worker, runner: EnvRunner, idle: bool = False) -> None:
    """Close ``worker``'s envs (``runner``'s) unless they were (``idle``: only if no thread
    runs the worker or is to, whose queued close then closes them)."""
    with worker.lock:
        if worker.closed or (idle and worker.scheduled):
            return
        worker.closed = True
    runner.close()


def _execute(runner: EnvRunner, command: Command) -> list[Completion]:
    """``command``'s answers; never raises (a command is always answered)."""
    try:
        return runner.execute(command)
    except BaseException as exc:
        error = RemoteError.capture(exc)
        return [Completion(i, command.kind, error=error) for i in command.env_indices]


def _resolve_threadsafe(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], outcome: Any) -> None:
    def resolve() -> None:
        if future.done():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    try:
        loop.call_soon_threadsafe(resolve)
    except RuntimeError:  # loop closed: nobody waits any more
        pass
