"""The thread executor: plain envs on worker threads.

Each worker thread hosts ``envs_per_worker`` envs (one by default, so that envs
blocking on I/O or ``time.sleep`` overlap) and takes commands from its own queue.
Completions reach the loop through ``call_soon_threadsafe``, coalesced so that a
burst of completions wakes the loop once; nothing polls. Threads are daemons: an
env stuck in a step cannot keep the interpreter from exiting.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Mapping
from typing import Any

from aenvs._commands import Command, CommandKind, Completion, RemoteError
from aenvs._env import EnvFn
from aenvs._runner import EnvRunner
from aenvs._specs import EnvSpec
from aenvs.executors._base import Capabilities
from aenvs.executors._workers import WorkerGroupExecutor

__all__ = ["ThreadExecutor"]

_STOP = None  # put in a worker's inbox to end its thread


class _Worker:
    def __init__(self, index: int, env_indices: list[int]) -> None:
        self.index = index
        self.env_indices = env_indices
        self.inbox: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        self.runner: EnvRunner | None = None
        # cleared (under the lock) when the pool gives up on this thread: it never answers again
        self.alive = True
        self.lock = threading.Lock()
        # set on the loop's thread, emptied by the worker's thread under the lock as it answers
        self.in_flight: dict[int, CommandKind] = {}
        self.exited: asyncio.Future[None] | None = None


class ThreadExecutor(WorkerGroupExecutor[_Worker]):
    """Runs envs on worker threads.

    Args:
        envs_per_worker: envs hosted by one thread (default 1: one thread per env).
        num_workers: number of threads instead (envs spread evenly; envs_per_worker wins if both are given).
        startup_timeout: seconds for every thread to build its envs (None: unbounded).
        close_timeout: seconds ``aclose`` waits for threads to finish their command.

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
    ) -> None:
        super().__init__(num_workers, envs_per_worker, startup_timeout, close_timeout)
        self._abandoned: list[_Worker] = []

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
            in_flight = worker.in_flight
            while (command := worker.inbox.get()) is not None:
                try:
                    done = runner.execute(command)
                except BaseException as exc:  # never leave a command unanswered
                    error = RemoteError.capture(exc)
                    done = [Completion(i, command.kind, error=error) for i in command.env_indices]
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

    # -- commands -------------------------------------------------------------------------

    def submit(self, command: Command) -> None:
        kind, worker_of = command.kind, self._worker_of
        if len(self._workers) == len(worker_of):  # one env per worker: no splitting needed
            whole = len(command.env_indices) == 1
            for i in command.env_indices:
                worker = worker_of[i]
                if worker.alive:
                    worker.in_flight[i] = kind
                    worker.inbox.put(command if whole else command.subset([i]))
                else:
                    self._answer_dead(worker, kind, [i])
            return
        for worker, part in self._split(command):
            in_flight = worker.in_flight
            for i in part.env_indices:
                in_flight[i] = kind
            worker.inbox.put(part)

    # -- restarts and closing ---------------------------------------------------------------

    def _describe(self, worker: _Worker, why: str) -> str:
        return f"thread {worker.index} hosting envs {worker.env_indices} {why}"

    def _stop(self, worker: _Worker, why: str) -> None:
        with worker.lock:
            if not worker.alive:
                return
            worker.alive = False
        self._abandoned.append(worker)
        worker.inbox.put(_STOP)
        self._flush_incoming()  # what it answered before being abandoned is delivered
        self._crash_in_flight(worker, why)

    async def aclose(self) -> None:
        for worker in self._workers:
            worker.inbox.put(_STOP)
        # threads abandoned in a stuck env are not waited for: they may never finish
        pending = [w.exited for w in self._workers if w.exited is not None and not w.exited.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.close_timeout)
        self.kill()

    def kill(self) -> None:
        # Threads cannot be killed: a thread stuck in an env is a daemon, abandoned here.
        for worker in self._workers:
            worker.inbox.put(_STOP)
        self._workers = []

    @property
    def abandoned_threads(self) -> int:
        """Threads still running although the executor gave up on them (stuck in an env)."""
        return sum(1 for w in self._abandoned if w.exited is not None and not w.exited.done())

    def counters(self) -> dict[str, int]:
        return {"abandoned_threads": self.abandoned_threads}


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
