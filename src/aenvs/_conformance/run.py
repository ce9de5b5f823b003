"""What every check of the kit shares: its failure type, the ledger that watches the
executor's own traffic, and the run that bounds every wait and tears down what a check built."""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar, cast

import torch
from tensordict import TensorDict, TensorDictBase

from aenvs import EnvError
from aenvs._commands import unpack

if TYPE_CHECKING:
    from aenvs import AsyncEnvPool
    from aenvs.executors import Capabilities, Executor

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)

N = 4  # envs in every pool the kit builds


class ConformanceError(AssertionError):
    """An executor failed a check of :func:`~aenvs.testing.check_executor`.

    Attributes:
        check: the name of the check that failed.
        executor: the executor, as ``'name' (ClassName)``.
        detail: what went wrong.

    Example:
        >>> str(ConformanceError("start_and_close", "'toy' (ToyExecutor)", "aclose hung"))
        "executor 'toy' (ToyExecutor) failed check 'start_and_close': aclose hung"
    """

    def __init__(self, check: str, executor: str, detail: str) -> None:
        super().__init__(f"executor {executor} failed check {check!r}: {detail}")
        self.check = check
        self.executor = executor
        self.detail = detail


class Skipped(Exception):
    """Raised by a check that does not apply to the executor: the reason."""


# -- watching the executor's own traffic ----------------------------------------------------


def _kind(kind: Any) -> str:
    return str(getattr(kind, "value", kind))


class Ledger:
    """The commands submitted to one executor and not answered yet, one per env."""

    def __init__(self) -> None:
        self.outstanding: dict[int, tuple[Any, float]] = {}
        self.violations: list[str] = []

    def watch(self, executor: Executor) -> None:
        """Wrap the instance's ``submit``, ``poll`` and ``run_whole``; a no-op for an instance without ``__dict__``."""
        submit, poll, run_whole = executor.submit, executor.poll, executor.run_whole

        def watched_submit(command: Any) -> None:
            now = time.monotonic()
            indices = list(command.env_indices)
            for i in indices:
                self.outstanding[i] = (command.kind, now)
            try:
                submit(command)
            except BaseException:
                for i in indices:
                    self.outstanding.pop(i, None)
                raise

        def watched_poll() -> list[Any]:
            completions = poll()
            for completion in completions:
                self._answered(completion)
            return completions

        def watched_run_whole(kind: Any, num_envs: int) -> Any:
            answers = run_whole(kind, num_envs)
            if answers is not None:
                for completion in unpack(answers):
                    self._answered(completion, "run_whole()")
            return answers

        try:
            vars(executor).update(submit=watched_submit, poll=watched_poll, run_whole=watched_run_whole)
        except TypeError:  # __slots__ without __dict__: only what the pool sees is checked
            pass

    def _answered(self, completion: Any, where: str = "poll()") -> None:
        i, kind = completion.env_index, completion.kind
        sent = self.outstanding.pop(i, None)
        if sent is None:
            self.violations.append(
                f"{where} returned an answer to env {i}'s {_kind(kind)} while no command of env {i} "
                "was outstanding: an answer delivered twice, or one to a command never submitted"
            )
        elif sent[0] != kind:
            self.violations.append(
                f"env {i}'s {_kind(sent[0])} was answered with a completion of kind {_kind(kind)}"
            )

    def unanswered(self) -> list[str]:
        now = time.monotonic()
        return [
            f"env {i}'s {_kind(kind)} (submitted {now - at:.1f} s ago)"
            for i, (kind, at) in sorted(self.outstanding.items())
        ]


# -- one run of the battery ----------------------------------------------------------------


def describe(executor: Executor) -> str:
    cls = type(executor)
    return f"{getattr(cls, 'name', cls.__name__)!r} ({cls.__qualname__})"


class Run:
    """What the checks share: the factory, the bounds, and the pools, gates and tasks of the current check."""

    def __init__(
        self,
        make_executor: Callable[[], Executor],
        label: str,
        *,
        timeout: float,
        close_timeout: float,
        close_grace: float,
        cancellations: int,
        seed: int,
        gate_dir: str,
        check: str,
    ) -> None:
        self.make_executor = make_executor
        self.label = label
        self.timeout = timeout
        self.close_timeout = close_timeout
        self.close_grace = close_grace
        self.cancellations = cancellations
        self.seed = seed
        self.gate_dir = gate_dir
        self.check = check
        self.rng = random.Random(f"{seed}/{check}")  # each check's own: selecting checks changes nothing
        self.pools: list[AsyncEnvPool] = []
        self.ledgers: list[Ledger] = []
        self.gates: list[str] = []
        self.tasks: list[asyncio.Future[Any]] = []

    # -- failing -------------------------------------------------------------------

    def failure(self, detail: str) -> ConformanceError:
        return ConformanceError(self.check, self.label, detail)

    def fail(self, detail: str) -> NoReturn:
        raise self.failure(detail)

    def expect(self, condition: bool, detail: str) -> None:
        if not condition:
            self.fail(detail)

    def verify(self) -> None:
        """Fail on the first answer the executor gave twice or to the wrong command."""
        for ledger in self.ledgers:
            if ledger.violations:
                self.fail(ledger.violations[0])

    def _unanswered(self) -> str:
        missing = [entry for ledger in self.ledgers for entry in ledger.unanswered()]
        return f"; submitted to the executor and never answered: {', '.join(missing)}" if missing else ""

    # -- bounded waits -----------------------------------------------------------------

    async def bounded(self, awaitable: Awaitable[T], what: str, limit: float | None = None) -> T:
        """Await ``awaitable`` within ``limit`` (default: the run's timeout), or fail saying ``what`` hung."""
        limit = self.timeout if limit is None else limit
        scope = asyncio.timeout(limit)
        try:
            async with scope:
                return await awaitable
        except TimeoutError:
            if scope.expired():
                raise self.failure(f"{what} did not finish within {limit} s{self._unanswered()}") from None
            raise
        finally:
            self.verify()

    async def raises(self, expected: type[E], awaitable: Awaitable[Any], what: str) -> E:
        """Await ``awaitable`` (bounded); it must raise ``expected``, which is returned."""
        try:
            await self.bounded(awaitable, what)
        except expected as exc:
            return exc
        except ConformanceError:
            raise
        except Exception as exc:
            self.fail(f"{what}: expected {expected.__name__}, got {type(exc).__name__}: {exc}")
        self.fail(f"{what}: expected {expected.__name__}, but it returned")

    # -- what a check builds (torn down by cleanup) --------------------------------------

    def new_executor(self) -> Executor:
        from aenvs.executors import Executor

        executor = cast(object, self.make_executor())  # a user's factory: checked, not trusted
        if not isinstance(executor, Executor):
            self.fail(f"make_executor() returned {executor!r}, not an aenvs.executors.Executor")
        return executor

    async def pool(self, env_fns: Sequence[Any], **options: Any) -> AsyncEnvPool:
        """A pool of ``env_fns`` on a new executor from the factory, started and watched."""
        from aenvs import AsyncEnvPool

        executor = self.new_executor()
        ledger = Ledger()
        ledger.watch(executor)
        self.ledgers.append(ledger)
        options.setdefault("close_timeout", self.close_timeout)
        pool = AsyncEnvPool(env_fns, executor=executor, **options)
        self.pools.append(pool)
        await self.bounded(pool.start(), f"starting a pool of {len(env_fns)} envs")
        self.expect(pool.executor is executor, "the pool does not run on the executor it was given")
        return pool

    def gate(self) -> str:
        """A file path: envs given ``ProbeFault("hang", gate=path)`` wait until :meth:`release`."""
        path = os.path.join(self.gate_dir, f"gate-{uuid.uuid4().hex}")
        self.gates.append(path)
        return path

    @staticmethod
    def release(gate: str) -> None:
        with open(gate, "w"):
            pass

    def start(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.append(task)
        return task

    async def cleanup(self) -> str | None:
        """Release every gate, cancel stray tasks, close every pool (killing what does not close);
        return what went wrong closing a pool, if anything."""
        problem: str | None = None
        for gate in self.gates:
            self.release(gate)
        for task in self.tasks:
            task.cancel()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=self.close_grace)
            for task in self.tasks:
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved: asyncio would log it otherwise
        limit = self.close_timeout + self.close_grace
        for pool in self.pools:
            if pool.is_closed:
                continue
            scope = asyncio.timeout(limit)
            try:
                async with scope:
                    await pool.aclose()
            except Exception as exc:
                pool.executor.kill()
                if problem is None:
                    problem = (
                        f"closing its pool at the end of the check did not finish within {limit} s"
                        if scope.expired()
                        else f"closing its pool at the end of the check raised {type(exc).__name__}: {exc}"
                    )
        self.pools, self.ledgers, self.gates, self.tasks = [], [], [], []
        return problem

    # -- receiving and checking echo results ----------------------------------------------

    async def answers(
        self, pool: AsyncEnvPool, expected: Collection[int], what: str
    ) -> tuple[dict[int, TensorDictBase], dict[int, EnvError]]:
        """Receive one step answer from each env of ``expected``: results and EnvErrors by env."""
        results: dict[int, TensorDictBase] = {}
        errors: dict[int, EnvError] = {}
        while len(results) + len(errors) < len(expected):
            got = len(results) + len(errors)
            try:
                out = await self.bounded(
                    pool.async_step_recv(min_get=1),
                    f"{what}: receiving ({got} of {len(expected)} answers so far)",
                )
            except EnvError as error:
                i = error.env_index
                self.expect(i in expected, f"{what}: an EnvError for env {i}, which was not sent a step")
                self.expect(i not in results and i not in errors, f"{what}: env {i} was answered twice")
                errors[i] = error
                continue
            for k in range(out.batch_size[0]):
                row = out[k]
                i = int(row["env_index"])
                self.expect(i in expected, f"{what}: a result for env {i}, which was not sent a step")
                self.expect(i not in results and i not in errors, f"{what}: env {i} was answered twice")
                results[i] = row
        return results, errors

    async def results(
        self, pool: AsyncEnvPool, expected: Collection[int], what: str
    ) -> dict[int, TensorDictBase]:
        """:meth:`answers` where no env may fail."""
        results, errors = await self.answers(pool, expected, what)
        if errors:
            i, error = next(iter(errors.items()))
            self.fail(f"{what}: env {i} raised {type(error).__name__}: {error}")
        return results

    def echo(self, row: TensorDictBase, env: int, action: float, steps: int, what: str) -> None:
        """``row`` is env ``env``'s own answer to ``action``, its ``steps``-th step since its reset."""
        index = int(row["env_index"])
        observation = [float(x) for x in row["next", "observation"].tolist()]
        sent = float(row["action"].reshape(-1)[0])
        reward = float(row["next", "reward"].reshape(-1)[0])
        self.expect(
            index == env and observation == [float(env), action, float(steps)] and sent == action,
            f"{what}: env {env} sent action {action} (its step {steps}) got a row with env_index={index}, "
            f"action={sent} and observation {observation} (the env echoes [env_index, action, steps]); "
            "a result routed to the wrong env, stale, or from a step that ran twice",
        )
        self.expect(reward == action, f"{what}: env {env}'s reward is {reward}, not its action {action}")

    def settled(self, pool: AsyncEnvPool, what: str) -> None:
        """Nothing in flight or ready, in the pool or at the executor."""
        stats = pool.stats()
        self.expect(
            stats.in_flight == 0 and stats.ready == 0,
            f"{what}: {stats.in_flight} command(s) still in flight and {stats.ready} result(s) ready "
            "after every send was answered",
        )
        self.expect(not self._unanswered(), f"{what}: the pool has every answer, but{self._unanswered()}")

    # -- capabilities --------------------------------------------------------------------

    def capabilities(self) -> Capabilities:
        """What the factory's executors declare they can do (read from a new, unstarted one)."""
        probe = self.new_executor()
        try:
            return probe.capabilities
        finally:
            probe.kill()

    def needs(self, *names: Literal["abort", "respawn"]) -> None:
        """Skip the check unless the executor declares these capabilities; fail if it declares
        one it does not implement (the base class's method, which raises NotImplementedError)."""
        from aenvs.executors import Executor

        probe = self.new_executor()
        try:
            capabilities = probe.capabilities
            missing = [name for name in names if not getattr(capabilities, name)]
            if missing:
                raise Skipped(f"its capabilities declare no {' / '.join(missing)}: {capabilities}")
            for name in names:
                self.expect(
                    getattr(type(probe), name) is not getattr(Executor, name),
                    f"its capabilities declare {name}=True, but it does not implement Executor.{name}",
                )
        finally:
            probe.kill()

    def probe_abort(self, executor: Executor) -> None:
        """``abort([])`` on a started executor that declares it can abort does nothing."""
        try:
            executor.abort([])
        except NotImplementedError as exc:
            self.fail(f"its capabilities declare abort=True, but abort([]) raised NotImplementedError: {exc}")


def echo_actions(values: Sequence[float], env_index: Sequence[int]) -> TensorDict:
    """Actions for probe envs (float64 ``[k, 1]``) with their ``env_index``."""
    return TensorDict(
        action=torch.tensor(list(values), dtype=torch.float64).reshape(-1, 1),
        env_index=torch.tensor(list(env_index), dtype=torch.int64),
        batch_size=[len(values)],
    )


def env_indices(td: TensorDictBase) -> list[int]:
    return [int(i) for i in td["env_index"].tolist()]


def first_column(td: TensorDictBase, *key: str) -> list[float]:
    return [float(row[0]) for row in td[key].tolist()]
