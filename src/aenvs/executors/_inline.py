"""The inline executor: envs run on the event loop itself.

``async def`` envs run concurrently, each in a task of its own, so thousands of
high-latency coroutine envs share one thread. Plain envs run one after the other in
a loop callback, after ``async_step_send`` has returned.

A coroutine env's command starts eagerly, inside ``submit``: its coroutine runs at
once, as the env's task (``asyncio.current_task()`` is that task), until it first
suspends, as Python 3.12's eager tasks do; the env's task then takes the suspended
coroutine over at the loop's next turn and drives it as if it had run it from the
start (cancellations and timeouts inside the env reach it as usual). So the env's
step is under way when ``async_step_send`` returns rather than one loop turn later:
in the overlapped loop, each env cycle needs one loop turn less.
"""

from __future__ import annotations

import asyncio
import types

# how eager tasks switch the current task (asyncio's own, private)
from asyncio.tasks import _enter_task, _leave_task  # pyright: ignore[reportPrivateUsage]
from collections import deque
from collections.abc import Coroutine, Generator, Mapping, Sequence
from typing import Any, cast

from aenvs._buffers import Buffers
from aenvs._commands import Command, CommandKind, Completion, Packed, RemoteError
from aenvs._env import EnvFn
from aenvs._runner import EnvRunner
from aenvs._specs import EnvSpec
from aenvs.executors._base import Capabilities, Executor

__all__ = ["InlineExecutor"]


_NOT_STARTED: Any = object()  # _CoroutineEnv.yielded of a coroutine its task has to start


class _CoroutineEnv:
    """A coroutine env's task and the command it runs."""

    __slots__ = ("command", "coro", "finished", "inbox", "index", "task", "yielded")

    def __init__(self, index: int) -> None:
        self.index = index
        self.task: asyncio.Task[None] | None = None
        self.inbox: asyncio.Future[None] | None = None  # what the task waits on between commands
        self.command: Command | None = None  # in flight
        # started by submit, not yet taken over by the task: the coroutine and what it awaits
        self.coro: Coroutine[Any, Any, Completion] | None = None
        self.yielded: Any = None
        # the last command's coroutine, the future it last awaited and its completion, released
        # when the next command starts (see _drive)
        self.finished: tuple[Any, ...] | None = None


@types.coroutine
def _thrown_into(coro: Coroutine[Any, Any, Any], exc: BaseException) -> Generator[Any, Any, Any]:
    """Throw ``exc`` into a suspended coroutine and drive it to its end, yielding what it awaits."""
    try:
        yielded = coro.throw(exc)
    except StopIteration as stop:
        return stop.value
    try:
        yield yielded
    except BaseException as again:
        return (yield from _thrown_into(coro, again))  # pyright: ignore[reportGeneralTypeIssues, reportUnknownVariableType]
    # a coroutine delegates as a generator (pyright knows only native coroutines' awaits)
    return (yield from coro)  # pyright: ignore[reportGeneralTypeIssues, reportUnknownVariableType]


class InlineExecutor(Executor):
    """Runs every env on the pool's event loop (what ``SerialEnv`` uses).

    ``envs_per_worker`` / ``num_workers`` are accepted, so that pool options work with
    every executor, and mean nothing here: the loop is the one worker.

    Example:
        >>> import asyncio
        >>> from aenvs import AsyncEnvPool
        >>> async def main():
        ...     async with AsyncEnvPool(["CartPole-v1"] * 2, executor="inline") as pool:
        ...         return (await pool.reset())["observation"].shape
        >>> asyncio.run(main())
        torch.Size([2, 4])
    """

    name = "inline"
    capabilities = Capabilities(abort=True, respawn=True, blocks_loop=True)

    def __init__(self, *, envs_per_worker: int | None = None, num_workers: int | None = None) -> None:
        super().__init__()
        self._runner: EnvRunner | None = None
        self._envs: dict[int, _CoroutineEnv] = {}  # coroutine envs, once they got a command
        self._is_async: list[bool] = []  # per env, looked up on every submit
        self._all_plain = False  # no env is async: a command only queues
        self._aborted: set[int] = set()
        self._cancelled: dict[int, asyncio.Task[None]] = {}  # aborted envs' tasks, awaited before a rebuild
        self._closing = False
        self._plain: deque[Command] = deque()  # plain envs' commands, run at the loop's next turn
        self._plain_scheduled = False
        self._interrupt: KeyboardInterrupt | None = None  # raised inside an env, for the next poll

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
        runner.close_timeout = self.close_timeout
        self._runner = runner
        self._is_async = [runner.is_async(i) for i in range(len(env_fns))]
        self._all_plain = not any(self._is_async)
        return specs

    def submit(self, command: Command) -> None:
        if self._all_plain:  # nothing to start now: the commands run at the loop's next turn
            self._plain.append(command)
            self._schedule_plain()
            return
        runner, loop = self._runner, self._loop
        assert runner is not None and loop is not None
        plain: list[int] = []
        is_async = self._is_async
        caller = asyncio.current_task(loop)  # the sender's task (None from a callback or the sync shim)
        if caller is not None:
            _leave_task(loop, caller)
        try:
            for i in command.env_indices:
                if not is_async[i]:
                    plain.append(i)
                elif i in self._aborted:  # given up on, not respawned: as dead as a killed worker
                    error = RemoteError.worker_died(f"the coroutine of env {i} was cancelled")
                    loop.call_soon(self._push, (Completion(i, command.kind, error=error),))
                else:
                    self._start(runner, loop, i, command)
        finally:
            if caller is not None:
                _enter_task(loop, caller)
        if plain:
            self._plain.append(command.subset(plain) if len(plain) < len(command.env_indices) else command)
            self._schedule_plain()

    def _schedule_plain(self) -> None:
        if not self._plain_scheduled:
            self._plain_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._run_queued)

    def _start(self, runner: EnvRunner, loop: asyncio.AbstractEventLoop, i: int, command: Command) -> None:
        """Run env ``i``'s command as its task until it first suspends, then hand it to the task."""
        coro = runner.execute_one(i, command)
        env = self._envs.get(i)
        if env is None:  # the env's first command starts in its new task, at the loop's next turn
            env = self._envs[i] = _CoroutineEnv(i)
            env.command, env.coro, env.yielded = command, coro, _NOT_STARTED
            env.task = loop.create_task(self._task(env))
            return
        env.finished = None  # freed here, where this command's objects are made
        task = env.task
        assert task is not None
        env.command = command
        _enter_task(loop, task)
        try:
            yielded = coro.send(None)
        except StopIteration as stop:  # finished without suspending
            env.command = None
            self._answer(stop.value)
            return
        except BaseException as exc:  # not an env failure (the runner answers those): answer it anyway
            env.command = None
            self._answer(Completion(i, command.kind, error=RemoteError.capture(exc)))
            return
        finally:
            _leave_task(loop, task)
        env.coro, env.yielded = coro, yielded
        inbox = env.inbox
        if inbox is not None and not inbox.done():  # done: the env cancelled its task meanwhile
            inbox.set_result(None)

    def _answer(self, completion: Completion) -> None:
        """Queue a coroutine env's answer (and the KeyboardInterrupt it raised, see :meth:`poll`)."""
        self._push_one(completion)
        if completion.error is not None and completion.error.interrupted:
            self._interrupt = _interrupt_for(completion)

    def poll(self) -> list[Completion]:
        """Every completion ready now; first, once, a KeyboardInterrupt an env raised.

        An interrupt raised inside an env on the loop is most likely the user's Ctrl-C
        landing in env code. The env's answer is an EnvError like any other; the interrupt
        itself goes to the pool call collecting results next (before it takes anything),
        so the caller sees it where it awaits the pool, once, and can catch it there.
        """
        interrupt = self._interrupt
        if interrupt is not None:
            self._interrupt = None
            raise interrupt
        completions = self._completions
        if not completions:
            return []
        items = list(completions)
        completions.clear()
        return items

    async def _task(self, env: _CoroutineEnv) -> None:
        await self._drive(env)  # a coroutine around the generator: tasks take only coroutines from 3.12

    @types.coroutine
    def _drive(self, env: _CoroutineEnv) -> Generator[Any, Any, None]:
        """An env's task: takes over each command's coroutine and runs it to its end.

        What the coroutine awaits is passed through to the task, and the task's answer
        (a result, or an exception such as a cancellation) back to the coroutine, as if
        the task had run it from its start.
        """
        loop = self._loop
        assert loop is not None
        while True:
            if self._closing or self._envs.get(env.index) is not env:
                return  # given up on by close or abort while its command swallowed the cancellation
            throw: BaseException | None = None
            if env.coro is None:
                env.inbox = loop.create_future()
                try:
                    yield from env.inbox
                except BaseException as exc:
                    if env.coro is None:  # nothing started: the executor stops this task
                        raise
                    throw = exc  # the command started cancelled its task: it gets the cancellation
                env.inbox = None
            coro, yielded = env.coro, env.yielded
            assert coro is not None
            env.coro = env.yielded = None
            if throw is None and yielded is not _NOT_STARTED:
                try:
                    yield yielded  # the task waits on what the coroutine awaits; it sends None back
                except BaseException as exc:  # thrown in by the task: a cancellation, a bad yield
                    throw = exc
            try:
                # from here the task drives the coroutine itself (C-level delegation, which
                # also forwards what is thrown in); only a throw is passed by hand first
                completion: Completion = yield from (coro if throw is None else _thrown_into(coro, throw))  # pyright: ignore[reportGeneralTypeIssues, reportUnknownVariableType]
            except BaseException as exc:  # not an env failure (the runner answers those)
                command, env.command = env.command, None
                if command is not None:  # else abort() answered it
                    error = RemoteError.capture(exc)
                    self._push((Completion(env.index, command.kind, error=error),))
                if type(exc) is GeneratorExit and not self._closing and self._envs.get(env.index) is env:
                    continue  # raised by the env itself (not a close of this task): it takes the next command
                raise
            env.command = None
            self._answer(completion)  # pyright: ignore[reportUnknownArgumentType] - see the yield from
            # This command's objects are released when the env's next command starts, not
            # here. CPython collects when allocations minus deallocations pass a threshold;
            # a send makes each env's step objects (coroutines, future, timer), its end frees
            # them, and with sends and ends in different loop turns every send would set off
            # collections, and through them full collections of every object torch loaded.
            # Freeing some of a step's objects where the next step's are made halves that
            # count's climb. Nothing is kept in this frame while the env waits.
            env.finished = (coro, yielded, completion)
            del coro, yielded, completion

    def flush(self) -> None:
        """Run the plain envs' commands now rather than at the loop's next turn."""
        if self._plain:
            self._run_plain_commands()

    def _run_queued(self) -> None:
        # only this callback clears the flag: a loop that never yields between a send and
        # the receive that flushes it (lockstep) then keeps one callback pending, not one per send
        self._plain_scheduled = False
        self._run_plain_commands()

    def _run_plain_commands(self) -> None:
        runner = self._runner
        while self._plain and runner is not None:
            self._run_plain(runner, self._plain.popleft())
            if self._interrupt is not None:  # the rest runs at the next turn, the caller hears of it first
                self._schedule_plain()
                break

    def run_whole(self, kind: CommandKind, num_envs: int) -> Packed | None:
        """Run now the one command queued, when it is ``kind`` to all ``num_envs`` plain envs
        and nothing else is queued or due; its answers packed when every env answered
        plainly, else queued as completions (and None returned)."""
        plain = self._plain
        if len(plain) != 1 or not self._all_plain or self._completions or self._interrupt is not None:
            return None
        command = plain[0]
        if command.kind is not kind or len(command.env_indices) != num_envs:
            return None
        plain.clear()
        return self.run_now(command)

    def runs_now(self) -> bool:
        return (
            self._all_plain
            and not self._plain
            and not self._completions
            and self._interrupt is None
            and self._runner is not None
        )

    def run_now(self, command: Command) -> Packed | None:
        runner = self._runner
        assert runner is not None
        done = runner.run_plain(command, stop_at_interrupt=True, packed=True)
        if type(done) is tuple:
            return done
        self._answered(command, cast("list[Completion]", done))
        return None

    def _run_plain(self, runner: EnvRunner, command: Command) -> None:
        """Run a plain envs' command, env after env."""
        self._answered(command, runner.run_plain(command, stop_at_interrupt=True))

    def _answered(self, command: Command, done: list[Completion]) -> None:
        """Queue the answers ``done`` of a plain envs' command, run env after env.

        After an env raised KeyboardInterrupt (answered as its EnvError; the interrupt goes
        to the caller through :meth:`poll`), the envs not run yet stay queued: they run at
        the loop's next turn, or when a receive flushes, so every env is answered once.
        """
        last = done[-1].error if done else None
        if last is not None and last.interrupted:
            self._interrupt = _interrupt_for(done[-1])
            indices = command.env_indices
            if len(done) < len(indices):
                self._plain.appendleft(command.subset(indices[len(done) :]))
        self._push(done)

    # -- restarts: a coroutine env can be given up on; a plain one blocks the loop while it runs

    def worker_alive(self, env_index: int) -> bool:
        return env_index not in self._aborted

    def abort(self, env_indices: Sequence[int]) -> None:
        for i in env_indices:
            env = self._envs.pop(i, None)
            if env is None:
                continue
            assert env.task is not None
            env.task.cancel()
            self._cancelled[i] = env.task
            coro, env.coro = env.coro, None
            if coro is not None:  # started, not yet taken over by its task
                _close(coro)
            self._aborted.add(i)
            command, env.command = env.command, None
            if command is not None:
                error = RemoteError.worker_died(f"the coroutine of env {i} was cancelled")
                self._push((Completion(i, command.kind, error=error),))

    async def respawn(self, env_indices: Sequence[int]) -> list[int]:
        runner = self._runner
        assert runner is not None
        rebuilt = [i for i in env_indices if i in self._aborted]
        # the aborted steps end first (their cancellation delivered), then their envs close
        tasks = [t for i in rebuilt if (t := self._cancelled.pop(i, None)) is not None and not t.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=self.close_timeout)
        for i in rebuilt:
            await runner.rebuild(i)
            self._aborted.discard(i)
        return rebuilt

    async def aclose(self) -> None:
        self._closing = True
        tasks = [self._cancel(env) for env in self._envs.values()]
        # and the aborted envs' tasks: their envs close next
        tasks += [task for task in self._cancelled.values() if not task.done()]
        self._cancelled.clear()
        if tasks:
            # an env that swallows its cancellation keeps its task: abandoned after
            # close_timeout (a task cannot be killed), as the thread executor abandons a thread
            await asyncio.wait(tasks, timeout=self.close_timeout)
            for task in tasks:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: asyncio would log it at the task's end
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.aclose()

    def kill(self) -> None:
        self._closing = True
        for env in self._envs.values():
            self._cancel(env)
        runner, self._runner = self._runner, None
        if runner is None:
            return
        # async envs close on the pool's loop, where their resources live
        loop = self._loop
        if loop is None or loop.is_closed() or _running_loop() is loop:
            runner.close()  # on the pool's loop: async closes run in tasks of it
        elif loop.is_running():  # in another thread: closed there, at its next turn
            loop.call_soon_threadsafe(runner.close)
        else:
            runner.close(loop)

    @staticmethod
    def _cancel(env: _CoroutineEnv) -> asyncio.Task[None]:
        assert env.task is not None
        env.task.cancel()
        coro, env.coro = env.coro, None
        if coro is not None:
            _close(coro)
        return env.task


def _interrupt_for(completion: Completion) -> KeyboardInterrupt:
    return KeyboardInterrupt(f"raised inside env {completion.env_index}'s {completion.kind.value}")


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _close(coro: Coroutine[Any, Any, Any]) -> None:
    """End a started coroutine that no task drives: cancel it where it waits, as a task would."""
    try:
        coro.throw(asyncio.CancelledError())
    except BaseException:
        pass
    coro.close()
