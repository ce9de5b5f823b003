"""The pool's calls for loops that drive it themselves: waiting for any result, giving up on
results, and sending and receiving as columns rather than TensorDicts (:func:`aenvs.collect`
uses them; so may a hand-written loop over text envs)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aenvs._batching import Batcher
from aenvs._commands import CommandKind
from aenvs._pool.holding import PoolHolder
from aenvs._pool.parts import PoolParts
from aenvs._pool.receiving import Receiver
from aenvs._pool.sending import EnvIndex, Sender

__all__ = ["LoopCalls"]

Columns = dict[tuple[str, ...], Any]
"""Entries by key (a tuple of names): per entry a numpy array, a tensor or a list of values,
one row per env."""


class LoopCalls:
    """Mixed into :class:`~aenvs.AsyncEnvPool`: calls for loops that drive the pool."""

    _parts: PoolParts
    _sender: Sender
    _receiver: Receiver

    def _ready_to_send(self) -> Batcher:  # AsyncEnvPool's
        raise NotImplementedError

    def abandon(self, env_index: EnvIndex | None = None) -> None:
        """Give up on the results of the step, reset and step-and-reset commands sent to
        ``env_index`` (default all envs): results ready now are dropped, those still due are
        dropped when they arrive, as for an interrupted whole-batch call (see
        :attr:`~aenvs.AsyncEnvPool.has_abandoned`). A loop that stops sending (a collector stopped early) leaves
        the pool usable this way.

        Example:
            >>> import asyncio
            >>> from aenvs import AsyncEnvPool
            >>> async def main():
            ...     async with AsyncEnvPool("CartPole-v1", num_envs=2, executor="inline") as pool:
            ...         await pool.async_reset_send()
            ...         pool.abandon()
            ...         return (await pool.reset()).batch_size  # no reset result left over
            >>> asyncio.run(main())
            torch.Size([2])
        """
        self._parts.abandon(env_index)

    async def hold(self, holder: PoolHolder) -> None:
        """Let ``holder``, a loop that drives the pool across calls (an :func:`aenvs.collect`
        collector), hold it until it calls :meth:`release`. Meanwhile another caller's call
        asks it first (the calls made in :func:`aenvs._pool.holding.acting_context` are its
        own): a send, receive or seeding takes the pool back (the holder receives what it
        has in flight and stops, or raises :class:`~aenvs.EnvBusyError` while in use);
        ``call``, ``get_attr`` and ``set_attr`` pause it around them. A loop holding the
        pool already is asked the same way first.

        Example:
            >>> import asyncio
            >>> from aenvs import AsyncEnvPool
            >>> class Loop:
            ...     async def yield_pool(self, *, visit: bool) -> None:
            ...         print("the loop yields; a visit:", visit)
            ...     def resume(self) -> None: ...
            ...     def yield_now(self, *, closing: bool) -> None: ...
            >>> async def main():
            ...     async with AsyncEnvPool("CartPole-v1", num_envs=2, executor="inline") as pool:
            ...         loop = Loop()
            ...         await pool.hold(loop)
            ...         await pool.get_attr("spec")  # a visit: the loop pauses around it
            ...         await pool.reset()  # takes the pool back
            ...         pool.release(loop)
            >>> asyncio.run(main())
            the loop yields; a visit: True
            the loop yields; a visit: False
        """
        self._ready_to_send()
        holding = self._parts.holding
        if holding.holder is not holder:
            await holding.claim()
            holding.holder = holder

    def release(self, holder: PoolHolder) -> None:
        """``holder`` holds the pool no more (see :meth:`hold`); nothing if it did not."""
        if self._parts.holding.holder is holder:
            self._parts.holding.holder = None

    async def wait_ready(self, timeout: float | None = None) -> None:
        """Wait until a step, reset or step-and-reset result is ready to receive (at once if
        one is), without taking it: a loop that receives several kinds waits here, then
        receives each kind with ``min_get=0``. ``timeout``: TimeoutError after that many seconds.
        Raises ValueError when no such command is in flight or ready (it would wait forever).

        Example:
            >>> import asyncio
            >>> from aenvs import AsyncEnvPool
            >>> async def main():
            ...     async with AsyncEnvPool("CartPole-v1", num_envs=2, executor="inline") as pool:
            ...         await pool.async_reset_send()
            ...         await pool.wait_ready()
            ...         return (await pool.async_reset_recv(min_get=0)).batch_size[0] >= 1
            >>> asyncio.run(main())
            True
        """
        self._ready_to_send()
        await self._receiver.wait_any(timeout)

    async def async_step_send_columns(self, env_index: Sequence[int], actions: Mapping[Any, Any]) -> None:
        """:meth:`~aenvs.AsyncEnvPool.async_step_send` with the actions given by key (``"action"`` or a tuple of
        names) as a tensor or a list of values (text...) with one row per env of
        ``env_index``: no TensorDict, no object per text action. Checked as
        :meth:`~aenvs.AsyncEnvPool.async_step_send` checks, naming the env and the key.

        Example:
            >>> import asyncio, torch
            >>> from aenvs import AsyncEnvPool
            >>> async def main():
            ...     async with AsyncEnvPool("CartPole-v1", num_envs=2, executor="inline") as pool:
            ...         await pool.reset()
            ...         await pool.async_step_send_columns([0, 1], {"action": torch.tensor([0, 1])})
            ...         await pool.wait_ready()
            ...         columns = await pool.async_step_recv_columns()
            ...         return columns[("reward",)].shape[1:], columns[("env_index",)].size >= 1
            >>> asyncio.run(main())
            ((1,), True)
        """
        await self._parts.settle(None, list(env_index), whole=False)
        self._sender.send_columns(CommandKind.STEP, list(env_index), actions)

    async def async_step_recv_columns(
        self,
        max_get: int | None = None,
        *,
        min_get: int | None = 0,
        env_index: EnvIndex | None = None,
        timeout: float | None = None,
    ) -> Columns:
        """:meth:`~aenvs.AsyncEnvPool.async_step_recv` as columns: per leaf of ``"next"`` a
        numpy array or a list of values (text...), ``("env_index",)`` the envs; no sent
        entries. For loops that read a few entries a step (see
        :meth:`~aenvs.AsyncEnvPool.async_step_send_columns`).

        By default it takes the results ready now (none: an empty ``env_index``);
        ``min_get``, ``env_index`` and ``timeout`` wait as for
        :meth:`~aenvs.AsyncEnvPool.async_step_recv` (``min_get=None``: every env of
        ``env_index``, in that order, or one).

        Example:
            >>> import asyncio, torch
            >>> from aenvs import AsyncEnvPool
            >>> async def whole_batch(pool):
            ...     await pool.async_step_send_columns([0, 1, 2], {"action": torch.tensor([1, 0, 1])})
            ...     columns = await pool.async_step_recv_columns(min_get=None, env_index=[2, 0, 1], timeout=5)
            ...     return columns[("env_index",)].tolist(), columns[("observation",)].shape
            >>> async def main():
            ...     async with AsyncEnvPool("CartPole-v1", num_envs=3, executor="thread") as pool:
            ...         await pool.reset()
            ...         return await whole_batch(pool)
            >>> asyncio.run(main())
            ([2, 0, 1], (3, 4))
        """
        whole = await self._receiver.take_whole(CommandKind.STEP, min_get, max_get, env_index, timeout)
        if whole is not None:  # a lockstep batch, answered plainly
            return self._parts.step_columns_whole(whole, self._ready_to_send())
        picked = await self._receiver.recv(CommandKind.STEP, min_get, max_get, env_index, timeout)
        return self._parts.step_columns(picked, self._ready_to_send())

    def step_columns_now(self, actions: Mapping[Any, Any]) -> Columns | None:
        """A step of every env with the actions by key (as for
        :meth:`async_step_send_columns`), run right here and returned as columns (as
        :meth:`async_step_recv_columns` returns them), where the pool can: on the inline
        executor with plain envs, every env free, and no limits, deadlines, step timeout or
        ``check_finite`` in the way. Elsewhere it returns None and sends nothing: send and
        receive the usual way then. Raises as those two calls would (a bad action before
        anything runs; an env's error as EnvError, the other envs' results left to receive).

        For lockstep loops over fast envs, where the send and the receive as two calls cost
        more than the envs themselves. Call it on the pool's loop (from a coroutine).

        Example:
            >>> import asyncio, torch
            >>> from aenvs import AsyncEnvPool
            >>> async def first_step(executor):
            ...     async with AsyncEnvPool("CartPole-v1", num_envs=2, executor=executor) as pool:
            ...         await pool.reset(seed=0)
            ...         columns = pool.step_columns_now({"action": torch.tensor([0, 1])})
            ...         return None if columns is None else columns[("observation",)].shape
            >>> asyncio.run(first_step("inline")), asyncio.run(first_step("thread"))
            ((2, 4), None)
        """
        return self._parts.step_columns_now(actions)

    async def step_and_maybe_reset_columns(self, actions: Mapping[Any, Any]) -> tuple[Columns, Columns]:
        """:meth:`~aenvs.AsyncEnvPool.step_and_maybe_reset` of every env with the actions and
        results as columns (see :meth:`async_step_send_columns`): the step's results (the
        leaves of ``"next"``, ``("env_index",)`` the envs, in order) and the next step's
        input (the reset rows where an episode ended, the step's observation elsewhere).

        A whole-batch call, as :meth:`~aenvs.AsyncEnvPool.step_and_maybe_reset`: a cancel
        abandons its results. Members with a batch shape of their own, or entries that are
        not fixed-shape or plain values, take the TensorDict calls instead (ValueError).

        Example:
            >>> import asyncio, torch
            >>> from aenvs import AsyncEnvPool
            >>> async def main():
            ...     async with AsyncEnvPool("CartPole-v1", num_envs=2, executor="inline") as pool:
            ...         await pool.reset(seed=0)
            ...         step, following = await pool.step_and_maybe_reset_columns({"action": torch.tensor([0, 1])})
            ...         return step[("reward",)].shape, following[("observation",)].shape
            >>> asyncio.run(main())
            ((2, 1), (2, 4))
        """
        return await self._parts.step_and_reset_columns(actions, self._ready_to_send())
