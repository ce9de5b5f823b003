"""The inline executor: envs run on the event loop itself.

``async def`` envs run concurrently, each driven by a task of its own that waits for
its next command (a future per command is cheaper than a task per command), so
thousands of high-latency coroutine envs share one thread. Plain envs run one after
the other in a loop callback, after ``async_step_send`` has returned.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from aenvs.buffers import Buffers
from aenvs.commands import Command, Completion, RemoteError
from aenvs.executors.base import Executor
from aenvs.gym import EnvFn
from aenvs.runner import EnvRunner, drive
from aenvs.specs import EnvSpec

__all__ = ["InlineExecutor"]


class InlineExecutor(Executor):
    """Runs every env on the pool's event loop (what ``SerialEnv`` uses).

    ``envs_per_worker`` / ``num_workers`` are accepted, so that pool options work with
    every executor, and mean nothing here: the loop is the one worker.

    Example:
        >>> pool = AsyncEnvPool(["CartPole-v1"] * 2, executor="inline")
    """

    name = "inline"

    def __init__(self, *, envs_per_worker: int | None = None, num_workers: int | None = None) -> None:
        super().__init__()
        self._runner: EnvRunner | None = None
        self._inbox: dict[int, asyncio.Future[Command]] = {}  # async env -> its next command
        self._drivers: dict[int, asyncio.Task[None]] = {}
        self._is_async: list[bool] = []  # per env, looked up on every submit
        self._in_flight: dict[int, Command] = {}  # async env -> the command its driver runs
        self._aborted: set[int] = set()
        self._plain: deque[Command] = deque()  # plain envs' commands, run at the loop's next turn
        self._plain_scheduled = False

    async def start(
        self,
        env_fns: Sequence[EnvFn],
        *,
        seeds: Sequence[int | None],
        make_kwargs: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> list[EnvSpec]:
        self._bind_loop()
        runner = EnvRunner.build(
            dict(enumerate(env_fns)),
            num_envs=len(env_fns),
            seeds=dict(enumerate(seeds)),
            make_kwargs=make_kwargs,
        )
        specs = [runner.specs[i] for i in range(len(env_fns))]
        self.buffers = Buffers.allocate(specs)
        runner.attach({i: self.buffers.rows(i) for i in range(len(env_fns))})
        self._runner = runner
        self._is_async = [runner.is_async(i) for i in range(len(env_fns))]
        return specs

    def submit(self, command: Command) -> None:
        runner, loop = self._runner, self._loop
        assert runner is not None and loop is not None
        plain = []
        inbox, is_async = self._inbox, self._is_async
        for i in command.env_indices:
            if is_async[i]:
                if i in self._aborted:  # given up on, not respawned: as dead as a killed worker
                    error = RemoteError.worker_died(f"the coroutine of env {i} was cancelled")
                    loop.call_soon(self._push, (Completion(i, command.kind, error=error),))
                    continue
                slot = inbox.get(i)
                if slot is None:
                    slot = inbox[i] = loop.create_future()
                    self._drivers[i] = loop.create_task(self._drive(runner, i))
                slot.set_result(command)
            else:
                plain.append(i)
        if plain:
            self._plain.append(command.subset(plain) if len(plain) < len(command.env_indices) else command)
            if not self._plain_scheduled:
                self._plain_scheduled = True
                loop.call_soon(self._run_queued)

    def flush(self) -> None:
        """Run the plain envs' commands now rather than at the loop's next turn."""
        if self._plain:
            self._run_queued()

    def _run_queued(self) -> None:
        self._plain_scheduled = False
        runner = self._runner
        while self._plain and runner is not None:
            self._run_plain(runner, self._plain.popleft())

    async def _drive(self, runner: EnvRunner, i: int) -> None:
        """Run env ``i``'s commands as they come, for as long as the executor lives."""
        loop, inbox = asyncio.get_running_loop(), self._inbox
        while True:
            command = await inbox[i]
            # the next command can only come after this one's completion is received
            inbox[i] = loop.create_future()
            self._in_flight[i] = command
            completion = await runner.execute_one(i, command)
            del self._in_flight[i]
            self._push((completion,))

    def _run_plain(self, runner: EnvRunner, command: Command) -> None:
        done: list[Completion] = []
        try:
            for i in command.env_indices:
                done.append(drive(runner.execute_one(i, command)))  # noqa: PERF401 - keeps what finished before a raise
        except BaseException as exc:  # KeyboardInterrupt inside an env: answer every env, then re-raise
            error = RemoteError.capture(exc)
            done.extend(Completion(i, command.kind, error=error) for i in command.env_indices[len(done) :])
            raise
        finally:
            self._push(done)

    # -- restarts: a coroutine env can be given up on; a plain one blocks the loop while it runs

    def worker_alive(self, env_index: int) -> bool:
        return env_index not in self._aborted

    def abort(self, env_indices: Sequence[int]) -> None:
        for i in env_indices:
            driver = self._drivers.pop(i, None)
            if driver is None:
                continue
            driver.cancel()
            self._inbox.pop(i, None)
            self._aborted.add(i)
            command = self._in_flight.pop(i, None)
            if command is not None:
                error = RemoteError.worker_died(f"the coroutine of env {i} was cancelled")
                self._push((Completion(i, command.kind, error=error),))

    async def respawn(self, env_indices: Sequence[int]) -> list[int]:
        runner = self._runner
        assert runner is not None
        rebuilt = [i for i in env_indices if i in self._aborted]
        for i in rebuilt:
            await runner.rebuild(i)
            self._aborted.discard(i)
        return rebuilt

    async def aclose(self) -> None:
        tasks = list(self._drivers.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.aclose()

    def kill(self) -> None:
        for task in self._drivers.values():
            task.cancel()
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.close()
