"""The pool's working parts, wired together: its slot table, sender, receiver, failures,
restart supervisor and abandoned commands; and what runs across them.

:class:`~aenvs.AsyncEnvPool` owns its lifecycle and its documented methods; it hands the
work to these parts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

from tensordict import TensorDictBase

from aenvs._batching import Batcher
from aenvs._commands import Command, CommandKind
from aenvs._pool.abandoned import AbandonedCommands
from aenvs._pool.failures import Failures
from aenvs._pool.receiving import Receiver
from aenvs._pool.restarts import RestartSupervisor
from aenvs._pool.sending import TD_ENV_INDEX, EnvIndex, Sender, member_index
from aenvs._pool.slots import SlotTable
from aenvs._pool.stats import PoolStats
from aenvs._tensors import td_keys
from aenvs.executors import Executor

__all__ = ["PoolParts"]


class PoolParts:
    """The parts of a pool of ``len(first_seeds)`` envs on ``executor``.

    Args:
        executor: runs the envs.
        first_seeds: per env, the seed of its first reset (or None).
        max_restarts: restarts allowed per env.
        restart_backoff: seconds before an env's first restart, doubled for each next one.
        restart: whether failed envs are restarted (``on_error="restart"``).
        step_timeout: seconds a step may take, or None.
        reset_timeout: seconds a reset may take, or None.
        check_finite: whether results with NaN or inf are errors.
        check_open: checks the pool is open (started, not closed).
        ready: checks the pool is usable now (open, on its loop) and returns its batcher.
        closed: whether the pool is closed.

    Example:
        >>> from aenvs.executors import make_executor
        >>> parts = PoolParts(make_executor("inline"), [None] * 2, max_restarts=0, restart_backoff=0.0,
        ...     restart=False, step_timeout=None, reset_timeout=None, check_finite=False,
        ...     check_open=lambda: None, ready=lambda: None, closed=lambda: False)
        >>> parts.slots.states, parts.stats(started_at=0.0).in_flight
        ([<EnvState.VOID: 'void'>, <EnvState.VOID: 'void'>], 0)
    """

    def __init__(
        self,
        executor: Executor,
        first_seeds: list[int | None],
        *,
        max_restarts: int,
        restart_backoff: float,
        restart: bool,
        step_timeout: float | None,
        reset_timeout: float | None,
        check_finite: bool,
        check_open: Callable[[], None],
        ready: Callable[[], Batcher],
        closed: Callable[[], bool],
    ) -> None:
        n = len(first_seeds)
        self.executor = executor
        self.slots = slots = SlotTable(n, executor.name)
        self.restarts = RestartSupervisor(
            executor,
            num_envs=n,
            max_restarts=max_restarts,
            backoff=restart_backoff,
            is_free=slots.is_free,
            rebuild_in_place=self._rebuild_in_place,
            rebuilt=slots.mark_rebuilt,
            broke=slots.mark_broken,
        )
        self.failures = failures = Failures(
            executor,
            num_envs=n,
            step_timeout=step_timeout,
            reset_timeout=reset_timeout,
            restart=self.restarts.failed if restart else None,
        )
        slots.vet = failures.vet if check_finite else None
        slots.on_failure = failures.on_failure
        self.sender = Sender(
            executor,
            slots,
            failures,
            self.restarts,
            first_seeds,
            ready=ready,
            drain=self.drain,
            closed=closed,
        )
        self.receiver = Receiver(
            slots, executor, drain=self.drain, closed=closed, ready=ready, indices=self.sender.indices
        )
        self.abandoned = AbandonedCommands(
            slots,
            drain=self.drain,
            wait_ready=executor.wait_ready,
            dropped=self.receiver.dropped,
            closed=closed,
        )
        self._check_open = check_open
        self._ready = ready

    def drain(self) -> None:
        """Record in the slot table the completions that arrived."""
        completions = self.executor.poll()
        if completions:
            self.slots.record(completions, time.perf_counter())

    async def settle(self, td: TensorDictBase | None, env_index: EnvIndex | None, *, whole: bool) -> None:
        """Before a command: wait for the envs it goes to that are being restarted (never for
        the others), and, for a whole-batch call (``whole``), drop what abandoned calls left."""
        if whole and self.abandoned.commands:
            await self.abandoned.settle()
        if self.restarts.active:
            indices = self.sender.indices(env_index)
            given = cast(object, td)  # a non-TensorDict is refused by the send, after this
            if indices is None and isinstance(given, TensorDictBase) and "env_index" in td_keys(given):
                indices = self.sender.indices(member_index(td), TD_ENV_INDEX)
            await self.restarts.settle(self.sender.all_envs if indices is None else indices)

    async def targets(self, env_index: EnvIndex | None) -> list[int]:
        """The envs a call goes to, once those being restarted are rebuilt."""
        self._check_open()
        await self.settle(None, env_index, whole=False)
        return self.sender.targets(None, env_index)

    async def ask(self, command: Command) -> list[Any]:
        """Send a call-like command and return its answers, one per env."""
        self._ready()
        self.sender.dispatch(command)
        return await self.receiver.answers(command.env_indices, command.label())

    async def _rebuild_in_place(self, indices: list[int]) -> None:
        self.sender.dispatch(Command(CommandKind.REBUILD, indices))
        await self.receiver.answers(indices, "rebuild")

    def stats(self, started_at: float) -> PoolStats:
        """A snapshot of the activity since ``started_at`` (0: not started)."""
        self.drain()
        slots = self.slots
        uptime = time.perf_counter() - started_at if started_at else 0.0
        return PoolStats(
            steps=list(slots.steps),
            step_latency_mean=slots.latency_means(),
            step_latency_last=list(slots.latency_last),
            errors=list(slots.errors),
            in_flight=slots.in_flight,
            ready=len(slots.ready),
            steps_per_second=sum(slots.steps) / uptime if uptime > 0 else 0.0,
            uptime=uptime,
            restarts=list(self.restarts.counts),
            timeouts=list(self.failures.counts),
            abandoned_threads=self.executor.counters().get("abandoned_threads", 0),
            receiving=len(self.receiver.receives.waiting),
            in_flight_envs=slots.in_flight_envs(),
        )
