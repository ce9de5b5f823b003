"""Receiving: results taken at once when ready, else awaited beside other receives; call answers.

A receive is cancellation-safe by construction: it waits (``wait_ready``, which consumes
nothing) and then harvests synchronously, so a timeout or a cancel can only land where
nothing has been taken yet.
"""

from __future__ import annotations

import asyncio
import operator
import time
from collections.abc import Callable
from typing import Any

from aenvs._cancellation import cancellation_requested
from aenvs._commands import CommandKind, Completion, Packed
from aenvs._errors import PoolClosedError
from aenvs._pool.fair_receives import Receive, WaitingReceives
from aenvs._pool.holding import Holding
from aenvs._pool.sending import EnvIndex
from aenvs._pool.slots import SlotTable
from aenvs.executors import Executor

__all__ = ["Receiver"]

_BY_ENV = operator.attrgetter("env_index")


class Receiver:
    """Takes the results receives ask for from the slot table, and the answers calls wait for.

    Args:
        slots: the pool's slot table.
        executor: the pool's executor (``flush``, ``wait_ready``, ``wake``).
        drain: records in ``slots`` what arrived.
        closed: whether the pool is closed.
        ready: checks the pool is usable now (open, on its loop).
        indices: the envs an ``env_index`` names, checked (None: it names none).
        holding: the loop holding the pool, if any: it stops before another caller receives.

    Example:
        >>> import asyncio
        >>> from aenvs._commands import CommandKind, Completion
        >>> from aenvs.executors import make_executor
        >>> slots = SlotTable(2)
        >>> slots.sent(CommandKind.RESET, [0, 1], now=0.0)
        >>> slots.record([Completion(0, CommandKind.RESET), Completion(1, CommandKind.RESET)], now=0.1)
        >>> receiver = Receiver(slots, make_executor("inline"), drain=lambda: None, closed=lambda: False,
        ...     ready=lambda: None, indices=lambda env_index: env_index)
        >>> [c.env_index for c in asyncio.run(receiver.recv(CommandKind.RESET, 2, None, None, None))]
        [0, 1]
    """

    def __init__(
        self,
        slots: SlotTable,
        executor: Executor,
        *,
        drain: Callable[[], None],
        closed: Callable[[], bool],
        ready: Callable[[], object],
        indices: Callable[[EnvIndex | None], list[int] | None],
        holding: Holding | None = None,
    ) -> None:
        self.receives = WaitingReceives(slots.outstanding, slots.ready, slots.pending)
        self.all_envs = list(range(slots.num_envs))
        # whether a whole batch may go from the executor to the receive straight (see
        # take_whole): nothing between (timeouts being stopped, deadlines, checks) asks to see it
        self.whole: Callable[[], bool] = lambda: False
        self._slots = slots
        self._executor = executor
        self._drain = drain
        self._closed = closed
        self._ready = ready
        self._indices = indices
        self._holding = holding or Holding()

    def dropped(self) -> None:
        """Results were dropped: let waiting receives check that they can still be satisfied."""
        if self.receives.waiting:
            self._executor.wake()

    async def recv(
        self,
        kind: CommandKind,
        min_get: int | None,
        max_get: int | None,
        env_index: EnvIndex | None,
        timeout: float | None,
    ) -> list[Completion]:
        """Take ``min_get`` to ``max_get`` results of ``kind`` from the envs ``env_index`` names
        (None: any env), waiting for them at most ``timeout`` seconds; sorted by env unless
        ``env_index`` orders them."""
        self._ready()
        if self._holding.holder is not None:
            await self._holding.claim()
        if cancellation_requested():  # a call that never suspends still honours a cancel, here
            await asyncio.sleep(0)
        wanted = self._indices(env_index)
        slots = self._slots
        if wanted is not None:
            if slots.outstanding[kind] != slots.num_envs:  # else every env has one due
                slots.check_due(kind, wanted)
            available = len(wanted)
        else:
            available = slots.outstanding[kind]
        if min_get is None:
            min_get = len(wanted) if wanted is not None else 1
        if min_get < 0 or (max_get is not None and max_get < max(min_get, 1)):
            raise ValueError(f"need 0 <= min_get <= max_get and max_get >= 1, got {min_get=} {max_get=}")
        if min_get > available:
            raise ValueError(
                f"min_get={min_get} but only {available} {kind.value} result(s) are in flight or ready; "
                "this would wait forever"
            )
        waiting = self.receives.waiting
        shared = wanted is None and bool(waiting)  # others wait: take only what is not theirs
        if waiting:
            self.receives.check_beside_others(kind, wanted, min_get)
        self._drain()
        picked = self._take_now(kind, wanted, min_get, max_get, shared)
        if len(picked) < min_get:
            self._executor.flush()  # about to wait: what the executor left for later can run now
            self._drain()
            picked = self._take_now(kind, wanted, min_get, max_get, shared)
        if len(picked) < min_get:
            receiving = self._wait_for(Receive(kind, wanted, min_get), max_get)
            # wait_for, not asyncio.timeout: the sync shim runs a call's first step outside a task
            picked = await (receiving if timeout is None else asyncio.wait_for(receiving, timeout))
        else:
            slots.consume(kind, picked)
        if wanted is None:
            picked.sort(key=_BY_ENV)
        return picked

    async def take_whole(
        self,
        kind: CommandKind,
        min_get: int | None,
        max_get: int | None,
        env_index: EnvIndex | None,
        timeout: float | None = None,
    ) -> list[int] | None:
        """The lockstep receive of a whole batch, with no completion made: when every env has
        ``kind`` in flight, nothing else is due, the receive asks for every env (no
        ``timeout``) and the executor answers all of them at once, plainly
        (:meth:`Executor.run_whole`, waiting for the rest while it holds only such answers),
        record them as received and return every env, in order; else None, and nothing
        was taken (the caller receives as usual: :meth:`recv`)."""
        if self._holding.holder is not None:
            await self._holding.claim()
        slots = self._slots
        n = slots.num_envs
        if (
            timeout is not None
            or (min_get is not None and min_get != n)
            or (max_get is not None and max_get < n)
            or not self._whole_stands(kind, waiting=0)
        ):
            return None
        self._ready()
        wanted = self._indices(env_index)
        if (wanted is not None and wanted != self.all_envs) or cancellation_requested():
            return None
        executor = self._executor
        answers = executor.run_whole(kind, n)
        if answers is None and executor.whole_due(kind, n):
            answers = await self._wait_whole(kind, n)
        if answers is None:
            return None
        slots.complete_whole(kind, answers, time.perf_counter())
        return self.all_envs

    def _whole_stands(self, kind: CommandKind, waiting: int) -> bool:
        """Whether a whole batch of ``kind`` may still be taken whole: every env has it in
        flight, nothing else is due, no more than ``waiting`` receives wait, and nothing
        between the executor and the receive asks to see the answers."""
        return self._slots.wholly_in_flight(kind) and len(self.receives.waiting) <= waiting and self.whole()

    async def _wait_whole(self, kind: CommandKind, n: int) -> Packed | None:
        """Wait, as a receive of every env, for the executor to hold all ``n`` answers packed;
        None as soon as that cannot be (another call took some, or waits beside it)."""
        receives, slots, executor = self.receives, self._slots, self._executor
        receive = Receive(kind, None, n)
        receives.add(receive)
        losses = slots.losses
        try:
            while True:
                await executor.wait_whole(n)  # consumes nothing: a cancel here leaves it all due
                if self._closed():
                    raise PoolClosedError("the pool was closed while waiting")
                if slots.losses != losses:  # as a receive waiting the usual way would
                    receives.check_still_possible(receive)
                if not self._whole_stands(kind, waiting=1):  # only this one may wait
                    return None
                answers = executor.run_whole(kind, n)
                if answers is not None or not executor.whole_due(kind, n):
                    return answers
        finally:
            receives.remove(receive)

    async def wait_any(self, timeout: float | None) -> None:
        """Wait until a transition result of any kind is ready, consuming nothing."""
        if self._holding.holder is not None:
            await self._holding.claim()
        slots = self._slots
        if not any(slots.outstanding.values()):
            raise ValueError(
                "no step, reset or step-and-reset is in flight or ready; this would wait forever"
            )
        self._drain()
        if slots.ready:
            return
        self._executor.flush()
        self._drain()

        async def arrival() -> None:
            while not slots.ready:
                await self._executor.wait_ready()
                if self._closed():
                    raise PoolClosedError("the pool was closed while waiting")
                self._drain()

        if not slots.ready:
            await (arrival() if timeout is None else asyncio.wait_for(arrival(), timeout))

    def _take_now(
        self,
        kind: CommandKind,
        wanted: list[int] | None,
        min_get: int,
        max_get: int | None,
        shared: bool,
        receive: Receive | None = None,
    ) -> list[Completion]:
        """What a receive (``receive`` if it waits already) takes now: nothing if it could not
        get ``min_get``; with ``shared``, only what other waiting receives do not hold."""
        if not self._slots.may_take(min_get):  # part of a batch is in, or none: nothing to look through
            return []
        return (
            self._take_unheld(receive, kind, max_get) if shared else self._slots.take(kind, wanted, max_get)
        )

    def _take_unheld(
        self, receive: Receive | None, kind: CommandKind, max_get: int | None
    ) -> list[Completion]:
        """Take for any env while other receives wait: leave what they hold and claim."""
        limit = self.receives.spare(kind, receive)
        if max_get is not None:
            limit = min(limit, max_get)
        return self._slots.take_unheld(kind, limit, self.receives.reserved)

    async def _wait_for(self, receive: Receive, max_get: int | None) -> list[Completion]:
        """Wait until ``receive`` can take its results, and take them (consumed before returning,
        so that no other receive can pick them while this one's caller resumes)."""
        kind, wanted, min_get = receive.kind, receive.wanted, receive.min_get
        receives, slots = self.receives, self._slots
        receives.add(receive)
        losses = slots.losses
        try:
            while True:
                await self._executor.wait_ready()
                if self._closed():
                    raise PoolClosedError("the pool was closed while waiting")
                self._drain()
                if slots.losses != losses:  # some results will never come: can this one still be met?
                    losses = slots.losses
                    receives.check_still_possible(receive)
                shared = wanted is None and len(receives.waiting) > 1
                picked = self._take_now(kind, wanted, min_get, max_get, shared, receive)
                if len(picked) >= min_get:
                    slots.consume(kind, picked)
                    return picked
        finally:
            receives.remove(receive)

    async def answers(self, indices: list[int], label: str) -> list[Any]:
        """Wait for the answers of a call-like command to ``indices``; raise the first error."""
        if cancellation_requested():
            await asyncio.sleep(0)
        slots = self._slots
        self._executor.flush()
        while not slots.answered(indices):
            self._drain()
            if slots.answered(indices):
                break
            try:
                await self._executor.wait_ready()
            except BaseException:
                slots.orphan(indices)  # cancelled: answers still on their way are dropped on arrival
                raise
            if self._closed():
                raise PoolClosedError("the pool was closed while waiting")
        answers = slots.pop_answers(indices)
        for c in answers:
            if c.error is not None:
                raise c.error.to_exception(c.env_index, label, self._executor.name)
        return [c.value for c in answers]
