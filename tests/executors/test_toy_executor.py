"""An executor written outside the package passes the conformance kit; broken ones fail it.

``ToyExecutor`` is what a third party would write: the public ``aenvs.executors.Executor``
base (and its helpers for subclasses, ``_bind_loop`` and ``_push_threadsafe``), with
one ``concurrent.futures`` future per env per command on a thread pool. It declares no
``abort`` / ``respawn`` capability, so the kit skips the timeout checks and says so.

What the package does not make public yet, and any executor needs: the per-env runner
that builds and steps envs (``EnvRunner``), the result buffers (``Buffers``) and the
command/completion records (``Command``, ``Completion``, ``RemoteError``). They are
imported from their private modules below, in one place.

The broken variants prove that the kit can fail, each with a message naming the check,
the executor and what went wrong.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import uvloop

from aenvs import EnvSpec
from aenvs.executors import (
    Buffers,
    Capabilities,
    Command,
    CommandKind,
    Completion,
    EnvRunner,
    Executor,
    InlineExecutor,
    RemoteError,
)
from aenvs.testing import ConformanceError, check_executor, check_executor_sync


class ToyExecutor(Executor):
    """Each env command is one future on a ``concurrent.futures.ThreadPoolExecutor``."""

    name = "toy"

    def __init__(self, max_workers: int = 8) -> None:
        super().__init__()
        self.max_workers = max_workers
        self._threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._runners: dict[int, EnvRunner] = {}  # one per env: envs step concurrently
        self._running: dict[int, concurrent.futures.Future[list[Completion]]] = {}

    async def start(
        self,
        env_fns: Sequence[Any],
        *,
        seeds: Sequence[int | None],
        make_kwargs: Mapping[int, Mapping[str, Any]] | None = None,
    ) -> list[EnvSpec]:
        loop = self._bind_loop()
        self._threads = concurrent.futures.ThreadPoolExecutor(
            self.max_workers, thread_name_prefix="toy-executor"
        )
        builds = [
            loop.run_in_executor(
                self._threads,
                functools.partial(
                    EnvRunner.build,
                    {i: fn},
                    num_envs=len(env_fns),
                    worker_index=i,
                    seeds={i: seeds[i]},
                    make_kwargs=make_kwargs,
                ),
            )
            for i, fn in enumerate(env_fns)
        ]
        built = await asyncio.gather(*builds, return_exceptions=True)
        runners = [r for r in built if isinstance(r, EnvRunner)]
        failures = [r for r in built if isinstance(r, BaseException)]
        if failures:
            for runner in runners:
                runner.close()
            self.kill()
            raise failures[0]
        specs = [runner.specs[i] for i, runner in enumerate(runners)]
        self.buffers = Buffers.allocate(specs)
        for i, runner in enumerate(runners):
            runner.attach({i: self.buffers.rows(i)})
        self._runners = dict(enumerate(runners))
        return specs

    def submit(self, command: Command) -> None:
        assert self._threads is not None
        for i in command.env_indices:
            future = self._threads.submit(self._runners[i].execute, command.subset([i]))
            self._running[i] = future
            future.add_done_callback(functools.partial(self._done, i, command.kind))

    def _done(self, i: int, kind: CommandKind, future: concurrent.futures.Future[list[Completion]]) -> None:
        """On the worker thread: hand the env's answer to the loop."""
        if future.cancelled():  # dropped by close
            return
        error = future.exception()
        if error is not None:  # the runner answers env failures itself; this is anything else
            self._answer([Completion(i, kind, error=RemoteError.capture(error))])
        else:
            self._answer(future.result())

    def _answer(self, completions: list[Completion]) -> None:
        self._push_threadsafe(completions)

    async def aclose(self) -> None:
        running = [asyncio.wrap_future(f) for f in self._running.values() if not f.done()]
        if running:
            await asyncio.wait(running, timeout=self.close_timeout)
        self.kill()

    def kill(self) -> None:
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        runners, self._runners = self._runners, {}
        for i, runner in runners.items():
            future = self._running.get(i)
            if future is None:
                runner.close()
            else:  # closed once its command ends (at once if it has), where it ran
                future.add_done_callback(lambda _, runner=runner: runner.close())


class DroppingExecutor(ToyExecutor):
    """Loses one completion in seven."""

    name = "dropping"
    answered = 0

    def _answer(self, completions: list[Completion]) -> None:
        self.answered += 1
        if self.answered % 7:
            super()._answer(completions)


class TwiceAnsweringExecutor(ToyExecutor):
    """Answers one command in five twice."""

    name = "twice"
    answered = 0

    def _answer(self, completions: list[Completion]) -> None:
        self.answered += 1
        super()._answer(completions)
        if self.answered % 5 == 0:
            super()._answer(completions)


class BoastingExecutor(ToyExecutor):
    """Declares it can abort and respawn, and implements neither."""

    name = "boasting"
    capabilities = Capabilities(abort=True, respawn=True)


class LoopHoggingExecutor(InlineExecutor):
    """The inline executor, claiming that env code stays off the loop."""

    name = "hogging"
    capabilities = Capabilities(abort=True, respawn=True, blocks_loop=False)


TOY_SKIPS = {
    "step_timeout_aborts_a_hung_step",
    "step_timeout_restarts_the_worker",
    "worker_death_is_a_crash",
}


async def test_toy_executor_passes_the_conformance_kit() -> None:
    report = await check_executor(ToyExecutor)
    assert set(report.skipped) == TOY_SKIPS, str(report)
    assert "abort" in report.skipped["step_timeout_aborts_a_hung_step"]
    assert "caller's process" in report.skipped["worker_death_is_a_crash"]
    assert "cancelled_receives_lose_nothing" in report.passed
    assert "skipped step_timeout_aborts_a_hung_step" in str(report)


def test_the_sync_runner_drives_the_kit_on_a_loop_of_its_own() -> None:
    report = check_executor_sync(
        ToyExecutor,
        loop_factory=uvloop.new_event_loop,
        checks=["routing_async_envs", "worker_death_is_a_crash"],
    )
    assert report.passed == ("routing_async_envs",)
    skipped = dict(report.skipped)
    assert "caller's process" in skipped.pop("worker_death_is_a_crash")
    assert set(skipped.values()) == {"excluded by the caller"}


async def test_a_dropped_completion_fails_with_what_was_never_answered() -> None:
    with pytest.raises(ConformanceError, match="never answered: env") as info:
        await check_executor(DroppingExecutor, timeout=2.0)
    error = info.value
    assert error.executor == "'dropping' (DroppingExecutor)"
    assert error.check in str(error) and "did not finish within 2.0 s" in error.detail


async def test_an_answer_given_twice_fails_as_delivered_twice() -> None:
    with pytest.raises(ConformanceError, match="an answer delivered twice") as info:
        await check_executor(TwiceAnsweringExecutor)
    assert info.value.executor == "'twice' (TwiceAnsweringExecutor)"


async def test_a_capability_declared_but_not_implemented_fails() -> None:
    with pytest.raises(
        ConformanceError, match=r"declare abort=True, but it does not implement Executor\.abort"
    ):
        await check_executor(BoastingExecutor, checks=["step_timeout_aborts_a_hung_step"])


async def test_env_code_on_the_loop_fails_unless_declared() -> None:
    with pytest.raises(ConformanceError, match="stepped on the event loop's thread") as info:
        await check_executor(LoopHoggingExecutor, checks=["env_code_runs_off_the_loop"])
    assert info.value.check == "env_code_runs_off_the_loop"


async def test_unknown_check_names_and_non_executors_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown checks"):
        await check_executor(ToyExecutor, checks=["routing"])
    with pytest.raises(TypeError, match=r"not an aenvs\.executors\.Executor"):
        await check_executor(object)  # pyright: ignore[reportArgumentType]
