"""The executor conformance kit: the behaviour battery every executor passes.

An executor (:class:`aenvs.executors.Executor`) is mechanism only, and everything a user
relies on that an executor could break is checked here through an
:class:`~aenvs.AsyncEnvPool` built on it: results routed by env index and never lost
or duplicated (also when receives are cancelled at random), sends that return before
the step is done, the receive rules (``min_get``, ``max_get``, ``env_index``), env
errors named and contained, calls, closing with commands in flight and ``kill()``, env
code kept off the event loop's thread; and, where the executor declares it can
(:class:`aenvs.executors.Capabilities`), per-command timeouts (``abort``) and restarts
of stuck workers (``respawn``), and where its envs run in processes of their own,
worker deaths.

As trio's ``check_two_way_stream`` and anyio's test kits, the kit needs no test
framework: :func:`check_executor` raises :class:`ConformanceError` (an AssertionError)
naming the check and the executor at the first failure, and returns a
:class:`ConformanceReport` of the checks passed and skipped otherwise. Every wait is
bounded, so a broken executor fails instead of hanging.

Besides what the pool sees, the kit watches the executor's own traffic: it wraps the
instance's ``submit`` and ``poll`` (transparently) and checks that every env of every
command submitted is answered exactly once, which also catches a duplicate answer the
pool would drop as stale.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from aenvs._conformance.checks import CHECKS
from aenvs._conformance.run import ConformanceError, Run, Skipped, describe

if TYPE_CHECKING:
    from aenvs.executors import Executor

__all__ = ["ConformanceError", "ConformanceReport", "check_executor", "check_executor_sync"]


@dataclass(frozen=True)
class ConformanceReport:
    """What :func:`~aenvs.testing.check_executor` ran: the checks passed and those skipped, with why.

    A check is skipped when the executor cannot do what it checks (its capabilities
    declare no ``abort``, or its envs run in the caller's process so no worker can die
    alone), or when the caller excluded it; a skipped check proved nothing.

    Example:
        >>> report = ConformanceReport("'thread' (ThreadExecutor)", ("start_and_close",), {})
        >>> print(report)
        executor 'thread' (ThreadExecutor): 1 checks passed, 0 skipped
          passed  start_and_close
    """

    executor: str
    passed: tuple[str, ...]
    skipped: Mapping[str, str]
    seconds: Mapping[str, float] = field(default_factory=dict[str, float])

    def __str__(self) -> str:
        lines = [f"executor {self.executor}: {len(self.passed)} checks passed, {len(self.skipped)} skipped"]
        for name in self.passed:
            took = self.seconds.get(name)
            lines.append(f"  passed  {name}" + (f" ({took:.2f} s)" if took is not None else ""))
        lines.extend(f"  skipped {name}: {why}" for name, why in self.skipped.items())
        return "\n".join(lines)


# -- entry points ---------------------------------------------------------------------------


async def check_executor(
    make_executor: Callable[[], Executor],
    *,
    timeout: float = 30.0,
    close_timeout: float = 1.0,
    close_grace: float = 5.0,
    cancellations: int = 300,
    seed: int = 0,
    gate_dir: str | os.PathLike[str] | None = None,
    checks: Collection[str] | None = None,
    exclude: Collection[str] = (),
) -> ConformanceReport:
    """Run the executor conformance battery; raise ConformanceError at the first failure.

    Each check builds pools of 4 envs with ``AsyncEnvPool(env_fns, executor=make_executor(), ...)``
    on the running event loop. The envs echo ``[env_index, action, steps]`` (so a result
    routed to the wrong env, lost, stale or duplicated shows), with ``async def`` steps
    for some, and injected faults (an exception, a hang until a file appears, SIGKILL)
    for others; their factories pickle by reference, for workers in other processes.
    The checks:

    ``start_and_close``, ``env_code_runs_off_the_loop`` (unless the executor declares
    ``blocks_loop``), ``kill_is_idempotent`` (also on an executor never started),
    ``routing_plain_envs`` / ``routing_async_envs`` (each result is its own env's, in
    any order of sends and completions), ``send_returns_before_step_finishes``,
    ``receive_min_get_max_get_env_index``, ``cancelled_receives_lose_nothing``
    (``cancellations`` receives cancelled at random points, seeded), ``env_error_names_the_env``
    (the other envs' results delivered), ``call_get_attr_set_attr``,
    ``busy_env_refuses_a_second_send``, ``close_with_commands_in_flight`` (returns within
    ``close_timeout + close_grace``, wakes a waiting receive), ``restart_after_env_error``
    (rebuilt in place); and where the executor can: ``step_timeout_aborts_a_hung_step``
    (its :class:`~aenvs.executors.Capabilities` declare ``abort``),
    ``step_timeout_restarts_the_worker`` (``abort`` and ``respawn``), ``worker_death_is_a_crash``
    (its envs run outside the caller's process). A check the executor cannot do is
    skipped, and reported as skipped, not passed; declaring a capability without
    implementing its method fails.

    Args:
        make_executor: returns a new, unstarted executor on each call.
        timeout: seconds any single wait may take (a receive, a start) before the check fails.
        close_timeout: the pools' ``close_timeout``.
        close_grace: seconds ``aclose`` may take beyond ``close_timeout``.
        cancellations: receives cancelled in ``cancelled_receives_lose_nothing``.
        seed: seeds the random choices (send groups, cancellation points).
        gate_dir: a directory the envs' workers can see, for the file latches of gated
            envs (default: a new temporary directory, removed at the end); give a shared
            file system's path for workers on other machines.
        checks: run only these checks (by name); the others are reported as skipped.
        exclude: skip these checks (by name).

    Returns:
        the checks passed and skipped.

    Raises:
        ConformanceError: the first check that failed, naming it and the executor.
        ValueError: an unknown check name.
        TypeError: ``make_executor()`` returned something else than an Executor.

    Example:
        >>> import asyncio
        >>> from aenvs.executors import ThreadExecutor
        >>> async def main():
        ...     report = await check_executor(ThreadExecutor, checks=["start_and_close", "routing_plain_envs"])
        ...     return report.passed
        >>> asyncio.run(main())
        ('start_and_close', 'routing_plain_envs')
    """
    unknown = sorted(set(checks or ()).union(exclude) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown checks {unknown}; the checks are {list(CHECKS)}")
    from aenvs.executors import Executor

    probe = cast(object, make_executor())  # a user's factory: checked, not trusted
    if not isinstance(probe, Executor):
        raise TypeError(f"make_executor() returned {probe!r}, not an aenvs.executors.Executor")
    label = describe(probe)
    probe.kill()
    own_dir = gate_dir is None
    directory = tempfile.mkdtemp(prefix="aenvs-conformance-") if gate_dir is None else os.fspath(gate_dir)
    passed: list[str] = []
    skipped: dict[str, str] = {}
    seconds: dict[str, float] = {}
    try:
        for name, check in CHECKS.items():
            if (checks is not None and name not in checks) or name in exclude:
                skipped[name] = "excluded by the caller"
                continue
            run = Run(
                make_executor,
                label,
                timeout=timeout,
                close_timeout=close_timeout,
                close_grace=close_grace,
                cancellations=cancellations,
                seed=seed,
                gate_dir=directory,
                check=name,
            )
            started = time.perf_counter()
            try:
                await _run_one(run, check)
            except Skipped as skip:
                skipped[name] = str(skip)
            else:
                passed.append(name)
                seconds[name] = time.perf_counter() - started
    finally:
        if own_dir:
            await asyncio.sleep(0.05)  # threads left in a released gate see it before it goes
            shutil.rmtree(directory, ignore_errors=True)
    return ConformanceReport(label, tuple(passed), skipped, seconds)


async def _run_one(run: Run, check: Callable[[Run], Awaitable[None]]) -> None:
    """One check, bounded as a whole too; any unexpected exception becomes a ConformanceError."""
    limit = run.timeout * 10  # a backstop: every wait inside is bounded by run.timeout
    scope = asyncio.timeout(limit)
    try:
        async with scope:
            await check(run)
        run.verify()
    except (ConformanceError, Skipped):
        raise
    except TimeoutError as exc:
        if scope.expired():
            raise run.failure(f"the check did not finish within {limit} s") from exc
        raise run.failure(f"raised {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        raise run.failure(f"raised {type(exc).__name__}: {exc}") from exc
    finally:
        problem = await run.cleanup()
    if problem is not None:  # the check passed, but closing what it left open failed
        raise run.failure(problem)


def check_executor_sync(
    make_executor: Callable[[], Executor],
    *,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
    **options: Any,
) -> ConformanceReport:
    """:func:`~aenvs.testing.check_executor` on a new event loop (from ``loop_factory``), for sync code.

    Takes the same keyword options as :func:`~aenvs.testing.check_executor`; must not be called from
    a running event loop.

    Example:
        >>> from aenvs.executors import InlineExecutor
        >>> check_executor_sync(InlineExecutor).passed[0]
        'start_and_close'
    """
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(check_executor(make_executor, **options))
