"""The pool's working parts, wired together: its slot table, sender, receiver, failures,
restart supervisor and abandoned commands; and what runs across them (building the envs,
closing, abandoning results, seeding, stats).

:class:`~aenvs.AsyncEnvPool` owns its lifecycle and its documented methods; it hands the
work to these parts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import numpy as np
from tensordict import NonTensorData, NonTensorStack, TensorDictBase

from aenvs._batching import Batcher
from aenvs._cancellation import cancellation_requested
from aenvs._commands import Command, CommandKind, Completion, Packed
from aenvs._env import EnvFn, EnvState
from aenvs._errors import EnvError
from aenvs._pool.abandoned import AbandonedCommands
from aenvs._pool.arguments import PoolOptions, StackMode, check_batch_shapes, is_dense
from aenvs._pool.deadlines import Deadlines
from aenvs._pool.failures import Failures
from aenvs._pool.holding import Holding
from aenvs._pool.receiving import Receiver
from aenvs._pool.restarts import RestartSupervisor
from aenvs._pool.sending import TD_ENV_INDEX, EnvIndex, Sender, member_index
from aenvs._pool.slots import SlotTable
from aenvs._pool.stats import LatencyPercentiles, PoolStats
from aenvs._seeding import seed_chain
from aenvs._tensors import td_get, td_items, td_keys
from aenvs.executors import Executor

__all__ = ["PoolParts", "other_loop_error"]

_STEP, _SMR = CommandKind.STEP, CommandKind.STEP_AND_RESET


def other_loop_error(
    started_on: asyncio.AbstractEventLoop | None, running: asyncio.AbstractEventLoop
) -> RuntimeError:
    """The error of a pool's coroutine run on ``running``, not the loop the pool ``started_on``."""
    now = "closed" if started_on is not None and started_on.is_closed() else "not this one"
    return RuntimeError(
        f"this pool was started on another event loop ({started_on!r}, now {now}) than the one "
        f"running this call ({running!r}): a pool belongs to the loop it started on, where its "
        "executor delivers results. Use it from that loop, or build one pool per loop "
        "(synchronous code: aenvs.SerialEnv / ParallelEnv keep one loop for you)"
    )


class PoolParts:
    """The parts of a pool of ``len(first_seeds)`` envs on ``executor``.

    Args:
        executor: runs the envs.
        first_seeds: per env, the seed of its first reset (or None).
        options: the pool's options (restarts, timeouts, limits, deadlines...).
        check_open: checks the pool is open (started, not closed).
        ready: checks the pool is usable now (open, on its loop) and returns its batcher.
        closed: whether the pool is closed.

    Example:
        >>> from aenvs.executors import make_executor
        >>> parts = PoolParts(make_executor("inline"), [None] * 2, PoolOptions(),
        ...     check_open=lambda: None, ready=lambda: None, closed=lambda: False)
        >>> parts.slots.states, parts.stats(started_at=0.0).in_flight
        ([<EnvState.VOID: 'void'>, <EnvState.VOID: 'void'>], 0)
    """

    def __init__(
        self,
        executor: Executor,
        first_seeds: list[int | None],
        options: PoolOptions,
        *,
        check_open: Callable[[], None],
        ready: Callable[[], Batcher],
        closed: Callable[[], bool],
    ) -> None:
        n = len(first_seeds)
        self.executor = executor
        self.options = options
        self.holding = Holding()  # a loop holding the pool (a collector), asked before others' calls
        self.slots = slots = SlotTable(n, executor.name)
        self.restarts = RestartSupervisor(
            executor,
            num_envs=n,
            max_restarts=options.max_restarts,
            backoff=options.restart_backoff,
            is_free=slots.is_free,
            rebuild_in_place=self._rebuild_in_place,
            rebuilt=slots.mark_rebuilt,
            broke=slots.mark_broken,
        )
        self.failures = failures = Failures(
            executor,
            num_envs=n,
            step_timeout=options.step_timeout,
            reset_timeout=options.reset_timeout,
            restart=self.restarts.failed if options.on_error == "restart" else None,
        )
        slots.vet = failures.vet if options.check_finite else None
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
            max_concurrency=options.max_concurrency,
            rate_limit=options.rate_limit,
        )
        self.receiver = Receiver(
            slots,
            executor,
            drain=self.drain,
            closed=closed,
            ready=ready,
            indices=self.sender.indices,
            holding=self.holding,
        )
        self.deadlines: Deadlines | None = None
        if options.episode_timeout is not None or options.truncate:
            self.deadlines = self.sender.deadlines = Deadlines(
                executor,
                slots,
                failures,
                self.restarts,
                episode_timeout=options.episode_timeout,
                truncate=options.truncate,
                reset_timeout=options.reset_timeout,
                drain=self.drain,
                closed=closed,
            )
        self.abandoned = AbandonedCommands(
            slots,
            drain=self.drain,
            wait_ready=executor.wait_ready,
            dropped=self.receiver.dropped,
            closed=closed,
        )
        if self.deadlines is None and self.sender.limits is None and slots.vet is None:
            # else the drain screens completions, or drops those of calls given up on
            self.receiver.whole = lambda: not failures.stopping and not self.abandoned.commands
        self._check_open = check_open
        self._ready = ready

    def drain(self) -> None:
        """Record in the slot table the completions that arrived."""
        completions = self.executor.poll()
        if completions:
            now = time.perf_counter()
            if self.failures.stopping:  # an answer may have beaten the stop of its command
                self.failures.screen(completions)
            if self.deadlines is not None:
                completions = self.deadlines.arrived(completions, now)
            self.slots.record(completions, now)

    async def settle(self, td: TensorDictBase | None, env_index: EnvIndex | None, *, whole: bool) -> None:
        """Before a command: a loop holding the pool (not the caller's) stops, its commands in
        flight received first (:class:`Holding`); then wait for the envs the command goes to
        that are being restarted (never for the others), and, for a whole-batch call
        (``whole``), drop what abandoned calls left."""
        if self.holding.holder is not None:
            await self.holding.claim()
        await self._settle(td, env_index, whole=whole)

    async def _settle(self, td: TensorDictBase | None, env_index: EnvIndex | None, *, whole: bool) -> None:
        if whole and self.abandoned.commands:
            await self.abandoned.settle()
        if self.restarts.active:
            indices = self.sender.indices(env_index)
            given = cast(object, td)  # a non-TensorDict is refused by the send, after this
            if indices is None and isinstance(given, TensorDictBase) and "env_index" in td_keys(given):
                indices = self.sender.indices(member_index(td), TD_ENV_INDEX)
            await self.restarts.settle(self.sender.all_envs if indices is None else indices)

    def batcher(self) -> Batcher:
        """The pool's batcher, once the pool is checked usable now (open, on its loop)."""
        return self._ready()

    def whole_now_open(self, kind: CommandKind) -> bool:
        """Whether a whole batch of ``kind`` may run where it is sent: as
        :meth:`Sender.whole_now_open` says, and nothing else in the pool stands between the
        send and the receive (no restart under way, no abandoned call's results due, no
        receive waiting, nothing that screens answers, no cancellation pending)."""
        return (
            self.executor.runs_now()  # first: no other executor ever does
            and self.holding.holder is None  # else the holder is asked first, which may wait
            and not self.restarts.active
            and not self.receiver.receives.waiting
            and self.receiver.whole()  # abandoned results due, timeouts being stopped, checks...
            and not cancellation_requested()
            and self.sender.whole_now_open(kind)
        )

    def send_whole_now(self, kind: CommandKind, td: TensorDictBase) -> Packed | list[int] | None:
        """:meth:`Sender.send_whole_now`, where :meth:`whole_now_open` holds; else None."""
        return self.sender.send_whole_now(kind, td) if self.whole_now_open(kind) else None

    async def targets(self, env_index: EnvIndex | None) -> list[int]:
        """The envs a call goes to, once those being restarted are rebuilt."""
        self._check_open()
        await self._settle(None, env_index, whole=False)
        return self.sender.targets(None, env_index)

    async def visit(self, env_index: EnvIndex | None, command: Callable[[list[int]], Command]) -> list[Any]:
        """Send the call-like ``command`` for the envs ``env_index`` names (default all) and
        return its answers, one per env; a loop holding the pool pauses around it."""
        async with self.holding.visit():
            return await self.ask(command(await self.targets(env_index)))

    async def ask(self, command: Command) -> list[Any]:
        """Send a call-like command and return its answers, one per env."""
        self._ready()
        self.sender.dispatch(command)
        return await self.receiver.answers(command.env_indices, command.label())

    async def start(
        self, env_fns: list[EnvFn], make_kwargs: dict[int, Mapping[str, Any]], stack: StackMode
    ) -> Batcher:
        """Build every env on the executor; return the batcher of their results, stacked as
        ``stack`` says (step results flagged ``"timed_out"`` when timeouts truncate). On
        failure, whatever the executor started is stopped and the error raised."""
        try:
            specs = await self.executor.start(env_fns, seeds=self.sender.first_seeds, make_kwargs=make_kwargs)
        except BaseException as exc:
            if isinstance(exc, EnvError) and not exc.executor:
                exc.executor = self.executor.name
            raise
        try:
            buffers = self.executor.buffers
            assert buffers is not None
            check_batch_shapes(specs)
            batcher = Batcher(
                specs,
                buffers,
                is_dense(stack, specs),
                self.options.truncate,
                copy=self.options.copy_results,
            )
        except BaseException:
            await self._stop_executor()
            raise
        self.sender.specs = specs
        self.failures.built(specs)
        self.slots.mark(self.sender.all_envs, EnvState.INIT)
        return batcher

    async def stop_sending(self) -> None:
        """The first half of :meth:`aenvs.AsyncEnvPool.aclose`: no more sends, receives woken,
        restarts under way stopped, a loop holding the pool stopped."""
        self.holding.closing()
        self.sender.close()
        self.executor.wake()
        await self.restarts.aclose()

    async def stop_workers(self) -> None:
        """The second half of :meth:`aenvs.AsyncEnvPool.aclose`, once the pool started: its
        workers stopped (and killed if need be), its slots cleared."""
        try:
            await self._stop_executor()
        finally:
            self.slots.clear()

    def kill(self, started: bool) -> None:
        """:meth:`aenvs.AsyncEnvPool.kill`: stop sending, and kill the workers if the pool ``started``."""
        self.sender.close()
        if started:
            self.restarts.forget()
            self.executor.kill()
            self.slots.mark(self.sender.all_envs, EnvState.VOID)

    async def _stop_executor(self) -> None:
        try:
            await self.executor.aclose()
        finally:
            self.executor.kill()

    def abandon(self, env_index: EnvIndex | None) -> None:
        """:meth:`aenvs.AsyncEnvPool.abandon`."""
        self._check_open()
        if self.holding.holder is not None:
            self.holding.claim_now()
        slots = self.slots
        indices = self.sender.indices(env_index) or self.sender.all_envs
        self.drain()
        for kind in (CommandKind.STEP, CommandKind.RESET, CommandKind.STEP_AND_RESET):
            due = [
                i
                for i in indices
                if slots.pending[i] is kind or (i in slots.ready and slots.ready[i].kind is kind)
            ]
            if due:
                self.abandoned.abandon(kind, due)

    async def seed(self, seed: int) -> int:
        """:meth:`aenvs.AsyncEnvPool.set_seed`."""
        if self.holding.holder is not None:
            await self.holding.claim()
        indices = await self.targets(None)
        seeds, after = seed_chain(seed, len(indices))
        await self.ask(Command(CommandKind.SEED, indices, seeds=dict(zip(indices, seeds, strict=True))))
        no_seeds: list[int | None] = [None] * len(indices)
        self.sender.first_seeds = no_seeds
        self.slots.mark(indices, EnvState.INIT)
        return after

    async def _rebuild_in_place(self, indices: list[int]) -> None:
        self.sender.dispatch(Command(CommandKind.REBUILD, indices))
        await self.receiver.answers(indices, "rebuild")

    def step_columns(self, picked: list[Completion], batcher: Batcher) -> dict[tuple[str, ...], Any]:
        """Step results as columns (see :meth:`AsyncEnvPool.async_step_recv_columns`)."""
        if not picked:
            return {("env_index",): np.zeros(0, np.int64)}
        inputs = self.slots.pop_inputs(picked)
        plain = batcher.step_columns(picked)
        if plain is not None:
            return plain
        return _step_columns(
            batcher.step_batch(picked, inputs)
        )  # a lazy pool, or entries other than plain values

    def step_columns_now(self, actions: Mapping[Any, Any]) -> dict[tuple[str, ...], Any] | None:
        """A step of every env with ``actions`` by key, run at once (:meth:`send_whole_now`) and
        received as columns; None, with nothing sent, where it cannot run at once."""
        if not self.whole_now_open(_STEP):
            return None
        batcher = self._ready()
        checked = batcher.root_actions(actions)
        if checked is None:  # not plainly the actions: the usual send says what is wrong
            return None
        sent = self.sender.send_checked_now(_STEP, checked, batcher)
        if isinstance(sent, tuple):  # every env answered plainly
            plain = batcher.step_columns(())
            assert plain is not None  # a dense pool, with no extra entries
            return plain
        # run in the caller: the answers are in the executor, as a receive would take them
        # (an interrupt an env raised comes first, then the first error; what is not taken
        # stays to receive, as after a send and a receive)
        self.drain()
        picked = self.slots.take(_STEP, sent, None)
        self.slots.consume(_STEP, picked)
        return self.step_columns(picked, batcher)

    def step_columns_whole(self, indices: list[int], batcher: Batcher) -> dict[tuple[str, ...], Any]:
        """:meth:`step_columns` of a lockstep batch of every env (``indices``), answered plainly."""
        inputs = self.slots.pop_inputs_of(indices)
        plain = batcher.step_columns(())
        return plain if plain is not None else _step_columns(batcher.step_whole(inputs))

    async def step_and_reset_columns(
        self, actions: Mapping[Any, Any], batcher: Batcher
    ) -> tuple[dict[tuple[str, ...], Any], dict[tuple[str, ...], Any]]:
        """A whole-batch step-and-reset with the actions and results as columns (see
        :meth:`AsyncEnvPool.step_and_maybe_reset_columns`)."""
        if not batcher.dense or batcher.batch_shape:
            raise ValueError(
                "step_and_maybe_reset_columns takes a dense pool of members without a batch shape "
                "of their own; use step_and_maybe_reset"
            )
        await self.settle(None, None, whole=True)
        sender = self.sender
        indices = sender.send_columns(_SMR, sender.all_envs, actions)
        try:
            whole = await self.receiver.take_whole(_SMR, None, None, None)
            if whole is not None:  # a lockstep batch, answered plainly: no completions
                inputs = self.slots.pop_inputs_of(whole)
                picked: list[Completion] = []
            else:
                picked = await self.receiver.recv(_SMR, None, None, indices, None)
                inputs = self.slots.pop_inputs(picked)
        except BaseException as exc:
            self.abandoned.give_up(exc, _SMR, indices)
            raise
        columns = batcher.step_and_reset_columns(picked)
        if columns is not None:
            return columns
        # extra entries other than plain values: through the TensorDicts, entry by entry
        out, reset = batcher.step_and_reset_batch(picked, inputs)
        step, following = _leaves(td_get(out, "next")), _leaves(reset)
        step[("env_index",)] = td_get(out, "env_index").numpy()
        following[("env_index",)] = td_get(reset, "env_index").numpy()
        return step, following

    def stats(self, started_at: float) -> PoolStats:
        """A snapshot of the activity since ``started_at`` (0: not started)."""
        self.drain()
        slots, limits = self.slots, self.sender.limits
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
            env_latency=slots.env_latency.percentiles(),
            policy_wait=slots.policy_wait.percentiles(),
            limit_wait=limits.wait.percentiles() if limits else LatencyPercentiles.empty(slots.num_envs),
            limit_wait_seconds=limits.wait_seconds if limits else 0.0,
            held=limits.held if limits else 0,
        )


def _step_columns(td: TensorDictBase) -> dict[tuple[str, ...], Any]:
    """A step batch's results (under "next") as columns, with its "env_index"."""
    columns = _leaves(td_get(td, "next"))
    columns[("env_index",)] = td_get(td, "env_index").numpy()
    return columns


def _leaves(td: TensorDictBase) -> dict[tuple[str, ...], Any]:
    """The leaves of ``td`` (tensors, non-tensor stacks) by key, without its "env_index"."""
    columns: dict[tuple[str, ...], Any] = {}
    for key, value in td_items(td, nested=True):
        if isinstance(value, TensorDictBase) and type(value) not in (NonTensorData, NonTensorStack):
            continue  # a sub-TensorDict: its entries come on their own
        path = cast("tuple[str, ...]", (key,) if isinstance(key, str) else tuple(key))
        if path != ("env_index",):
            columns[path] = value
    return columns
