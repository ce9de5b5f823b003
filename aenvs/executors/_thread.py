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
from collections.abc import Mapping, Sequence
from typing import Any

from aenvs._buffers import Buffers
from aenvs._commands import Command, CommandKind, Completion, RemoteError
from aenvs._env import EnvFn
from aenvs._runner import EnvRunner
from aenvs._specs import EnvSpec
from aenvs.executors._base import Capabilities, Executor, check_worker_options, split_envs

__all__ = ["ThreadExecutor"]

_STOP = None  # put in a worker's inbox to end its thread


class _Worker:
    def __init__(self, index: int, env_indices: list[int]) -> None:
        self.index = index
        self.env_indices = env_indices
        self.inbox: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.runner: EnvRunner | None = None
        # set (under the lock) when the pool gives up on this thread: it never answers again
        self.abandoned = False
        self.lock = threading.Lock()
        self.exited: asyncio.Future[None] | None = None


class ThreadExecutor(Executor):
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

    def __init__(
        self,
        *,
        envs_per_worker: int | None = None,
        num_workers: int | None = None,
        startup_timeout: float | None = None,
        close_timeout: float = 5.0,
    ) -> None:
        super().__init__()
        check_worker_options(num_workers, envs_per_worker)
        self.envs_per_worker = envs_per_worker
        self.num_workers = num_workers
        self.startup_timeout = startup_timeout
        self.close_timeout = close_timeout
        self._workers: list[_Worker] = []
        self._worker_of: list[_Worker] = []
        self._in_flight: dict[int, CommandKind] = {}  # env -> command sent and not answered yet
        self._abandoned: list[_Worker] = []
        self._recipe: tuple[Sequence[EnvFn], Sequence[int | None], Mapping[int, Mapping[str, Any]] | None] = (
            (),
            (),
            None,
        )

    def _plan(self, num_envs: int) -> list[list[int]]:
        return split_envs(num_envs, self.envs_per_worker, self.num_workers, num_envs)

    async def start(
        self,
        env_fns: Sequence[EnvFn],
        *,
        seeds: Sequence[int | None],
        make_kwargs: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> list[EnvSpec]:
        self._bind_loop()
        self._recipe = (env_fns, seeds, make_kwargs)
        built: list[tuple[list[int], asyncio.Future[EnvRunner]]] = []
        for index, env_indices in enumerate(self._plan(len(env_fns))):
            worker = _Worker(index, env_indices)
            self._workers.append(worker)
            built.append((env_indices, self._launch(worker)))
        self._worker_of = [w for w in self._workers for _ in w.env_indices]
        try:
            runners: list[EnvRunner] = await self._await_built(built)
        except BaseException:
            await self.aclose()
            raise
        specs = [spec for r in runners for _, spec in sorted(r.specs.items())]
        self.buffers = Buffers.allocate(specs)
        for worker, runner in zip(self._workers, runners, strict=True):
            runner.attach({i: self.buffers.rows(i) for i in worker.env_indices})
            worker.runner = runner
        return specs

    def _launch(self, worker: _Worker) -> asyncio.Future[EnvRunner]:
        """Start ``worker``'s thread; the future resolves once its envs are built."""
        loop = self._loop
        assert loop is not None
        env_fns, seeds, make_kwargs = self._recipe
        ready: asyncio.Future[EnvRunner] = loop.create_future()
        exited: asyncio.Future[None] = loop.create_future()
        fns = {i: env_fns[i] for i in worker.env_indices}
        worker.thread = threading.Thread(
            target=self._main,
            args=(
                worker,
                fns,
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
        worker.thread.start()
        return ready

    def _main(
        self,
        worker: _Worker,
        env_fns: dict[int, EnvFn],
        num_envs: int,
        seeds: dict[int, int | None],
        make_kwargs: Mapping[int, Mapping[str, Any]] | None,
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
            _resolve_threadsafe(loop, ready, runner)
            while (command := worker.inbox.get()) is not None:
                try:
                    done = runner.execute(command)
                except BaseException as exc:  # never leave a command unanswered
                    error = RemoteError.capture(exc)
                    done = [Completion(i, command.kind, error=error) for i in command.env_indices]
                with worker.lock:
                    if worker.abandoned:
                        break
                    self._push_threadsafe(done)
        finally:
            if runner is not None:
                runner.close()
            _resolve_threadsafe(loop, exited, None)

    def submit(self, command: Command) -> None:
        in_flight, kind, worker_of = self._in_flight, command.kind, self._worker_of
        for i in command.env_indices:
            in_flight[i] = kind
        if len(self._workers) == len(worker_of):  # one env per worker: no splitting needed
            whole = len(command.env_indices) == 1
            for i in command.env_indices:
                worker = worker_of[i]
                if worker.abandoned:
                    self._answer_dead(worker, command.subset([i]))
                else:
                    worker.inbox.put(command if whole else command.subset([i]))
            return
        by_worker: dict[int, list[int]] = {}
        for i in command.env_indices:
            by_worker.setdefault(worker_of[i].index, []).append(i)
        for index, env_indices in by_worker.items():
            worker = self._workers[index]
            if worker.abandoned:
                self._answer_dead(worker, command.subset(env_indices))
            else:
                worker.inbox.put(command.subset(env_indices))

    def _answer_dead(self, worker: _Worker, command: Command) -> None:
        """A command for the envs of an abandoned thread: answered with a crash, soon."""
        error = _abandoned_error(worker)
        lost = [Completion(i, command.kind, error=error) for i in command.env_indices]
        assert self._loop is not None
        self._loop.call_soon(self._push, lost)

    def _push(self, completions: Sequence[Completion]) -> None:
        in_flight = self._in_flight
        for c in completions:
            in_flight.pop(c.env_index, None)
        super()._push(completions)

    # -- restarts ----------------------------------------------------------------------

    def worker_alive(self, env_index: int) -> bool:
        return not self._worker_of[env_index].abandoned

    def abort(self, env_indices: Sequence[int]) -> None:
        # A thread cannot be killed: it is abandoned (a daemon, counted in abandoned_threads)
        # and whatever it finishes later is dropped.
        for worker in {id(w): w for w in (self._worker_of[i] for i in env_indices)}.values():
            with worker.lock:
                if worker.abandoned:
                    continue
                worker.abandoned = True
            self._abandoned.append(worker)
            worker.inbox.put(_STOP)
            self._flush_incoming()  # what it answered before being abandoned is delivered
            error = _abandoned_error(worker)
            lost = [
                Completion(i, self._in_flight[i], error=error)
                for i in worker.env_indices
                if i in self._in_flight
            ]
            if lost:
                self._push(lost)

    async def respawn(self, env_indices: Sequence[int]) -> list[int]:
        dead = {id(w): w for w in (self._worker_of[i] for i in env_indices) if w.abandoned}
        rebuilt: list[int] = []
        for old in dead.values():
            worker = _Worker(old.index, old.env_indices)
            (runner,) = await self._await_built([(worker.env_indices, self._launch(worker))])
            assert self.buffers is not None
            runner.attach({i: self.buffers.rows(i) for i in worker.env_indices})
            worker.runner = runner
            self._workers[self._workers.index(old)] = worker
            for i in worker.env_indices:
                self._worker_of[i] = worker
            rebuilt.extend(worker.env_indices)
        return rebuilt

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


def _abandoned_error(worker: _Worker) -> RemoteError:
    return RemoteError.worker_died(
        f"thread {worker.index} hosting envs {worker.env_indices} was abandoned: a command outlived its timeout"
    )


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
