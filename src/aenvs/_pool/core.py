"""AsyncEnvPool: many envs, stepped by awaiting, on a pluggable executor.

The pool is policy: env slots and their states, ``env_index`` routing, batching
(``min_get`` / ``max_get``), stacking and the error model live here and in the modules
beside it. The executor is mechanism: it runs the envs and hands completions back.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Self

import torch
from tensordict import TensorDictBase

from aenvs._batching import Batcher
from aenvs._commands import Command, CommandKind
from aenvs._env import EnvFn, EnvState
from aenvs._errors import PoolClosedError
from aenvs._pool import arguments
from aenvs._pool.arguments import StackMode
from aenvs._pool.deadlines import OnTimeout
from aenvs._pool.loops import LoopCalls
from aenvs._pool.masked import WholeBatchCalls
from aenvs._pool.parts import PoolParts, other_loop_error
from aenvs._pool.rollout import rand_action as _rand_action, rollout as _rollout
from aenvs._pool.sending import EnvIndex, Seed, check_options
from aenvs._pool.stats import PoolStats
from aenvs._rate_limit import RateLimit
from aenvs._seeding import seed_chain
from aenvs._specs import EnvSpec
from aenvs.executors import Executor

__all__ = ["AsyncEnvPool", "EnvIndex", "PoolStats", "StackMode"]

_STEP, _RESET, _SMR = CommandKind.STEP, CommandKind.RESET, CommandKind.STEP_AND_RESET


class AsyncEnvPool(LoopCalls):
    """A pool of RL envs whose commands are awaited on the event loop.

    Args:
        env_fns: zero-argument callables (or callables asking for an :class:`EnvContext`,
            as its docstring says) returning a gymnasium env or an :class:`aenvs.Env`, or
            gymnasium ids; or one of those with ``num_envs``.
        num_envs: how many envs to build from a single ``env_fns``.
        executor: ``"inline"``, ``"thread"`` or an :class:`~aenvs.executors.Executor`.
        stack: ``"dense"`` (every env has the same keys and shapes), ``"lazy"``
            (``LazyStackedTensorDict``) or ``"auto"`` (dense when possible).
        envs_per_worker: envs per worker of the executor (default: from ``num_workers``).
        num_workers: workers to spread the envs over evenly, when ``envs_per_worker`` is
            not given (default: the executor's own).
        seed: seeds the envs' first reset with TorchRL's seed chain (and ``EnvContext.seed``).
        make_kwargs: keyword arguments for ``gymnasium.make`` of id strings (one dict, or one per env).
        on_error: ``"raise"`` (an env's failure is an EnvError; the env goes to ERROR) or
            ``"restart"`` (the same EnvError, and the env is then rebuilt from its factory in
            the background, its worker replaced if it died or hung; it needs a reset after).
        max_restarts: restarts allowed per env; past it the env stays in ERROR and every
            later send to it fails at once.
        restart_backoff: seconds before an env's first restart, doubled for each next one
            (at most 30 s).
        step_timeout: seconds a step (or step-and-reset) may take; a command that outlives
            it is an EnvTimeoutError and its worker is stopped (killed, or abandoned for a
            thread) and, with ``on_error="restart"``, replaced.
        reset_timeout: seconds a reset may take, with the same consequences as ``step_timeout``.
        episode_timeout: seconds an episode may last, from when the pool received its reset
            result: the step in flight when it passes is stopped as ``step_timeout`` stops
            one; a step sent after it is not run (its outcome is ready at once).
        on_timeout: what a ``step_timeout`` or ``episode_timeout`` does: ``"raise"`` (an
            EnvTimeoutError for the env) or ``"truncate"``: the env's result is a normal one
            ending its episode, ``("next", "done")`` and ``("next", "truncated")`` True,
            ``("next", "terminated")`` False, reward 0, ``("next", "timed_out")`` True (every
            step result has that flag then), its last observation under ``"next"``; the env,
            rebuilt if its worker was stopped, needs a reset (step-and-reset does it). A
            reset that times out still raises. See the guide's "Deadlines" page.
        startup_timeout: seconds the executor may take to build every env.
        close_timeout: seconds ``aclose`` waits for workers to stop before killing them.
        check_finite: check the values of every result, not only their layout: NaN or inf
            in a float entry, or a text observation outside its ``Text`` space (its length,
            a character outside its charset), is an EnvError for its env (the other envs'
            results are delivered); off by default, as it costs a pass over every result.
            A text observation that is not a ``str`` is its env's error either way.
        max_concurrency: at most this many envs run a reset, step or step-and-reset at once;
            the other envs' commands are held in the pool, in the order sent. Default: no limit.
        rate_limit: a :class:`~aenvs.RateLimit` (a token bucket, shareable by pools) each env's
            reset, step or step-and-reset takes a token from at its dispatch. Default: no limit.
            A held command counts as sent; its timeout counts from its dispatch.
        copy_results: True (default): every result is a batch of its own. False, for loops
            that use a step's results before the envs' next step (as gymnasium's
            ``copy=False``): in a step (or step-and-reset) result of the whole pool in env
            order, the entries under ``"next"`` are views of the pool's buffers, which the
            envs' next step overwrites, instead of copies. The next step's input (the
            reset observations of a step-and-reset) and partial batches are still copies.

    Example:
        >>> import asyncio, torch
        >>> from aenvs import AsyncEnvPool
        >>> async def main():
        ...     async with AsyncEnvPool(["CartPole-v1"] * 4, executor="thread") as pool:
        ...         td = await pool.reset()
        ...         td["action"] = torch.randint(0, 2, (4,))
        ...         await pool.async_step_send(td)
        ...         out = await pool.async_step_recv(min_get=2)
        ...         return out["next", "reward"].shape[0] >= 2
        >>> asyncio.run(main())
        True
    """

    def __init__(
        self,
        env_fns: EnvFn | Sequence[EnvFn],
        *,
        num_envs: int | None = None,
        executor: str | Executor = "thread",
        stack: StackMode = "auto",
        envs_per_worker: int | None = None,
        num_workers: int | None = None,
        seed: int | None = None,
        make_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        on_error: Literal["raise", "restart"] = "raise",
        max_restarts: int = 3,
        restart_backoff: float = 0.1,
        step_timeout: float | None = None,
        reset_timeout: float | None = None,
        startup_timeout: float | None = None,
        close_timeout: float | None = None,
        check_finite: bool = False,
        episode_timeout: float | None = None,
        on_timeout: OnTimeout = "raise",
        max_concurrency: int | None = None,
        rate_limit: RateLimit | None = None,
        copy_results: bool = True,
    ) -> None:
        arguments.check_choices(stack, on_error)
        options = arguments.PoolOptions(
            on_error=on_error,
            max_restarts=max_restarts,
            restart_backoff=restart_backoff,
            step_timeout=step_timeout,
            reset_timeout=reset_timeout,
            startup_timeout=startup_timeout,
            close_timeout=close_timeout,
            check_finite=check_finite,
            episode_timeout=episode_timeout,
            on_timeout=on_timeout,
            max_concurrency=max_concurrency,
            rate_limit=rate_limit,
            copy_results=copy_results,
        )
        self._env_fns = arguments.env_fns_list(env_fns, num_envs)
        n = len(self._env_fns)
        self._executor = options.executor(executor, envs_per_worker=envs_per_worker, num_workers=num_workers)
        self._stack: StackMode = stack
        self._make_kwargs = arguments.make_kwargs_by_env(make_kwargs, n)
        self._started = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the pool started on, its own
        self._batcher: Batcher | None = None
        self._started_at = 0.0
        self._start_lock = asyncio.Lock()
        first_seeds: list[int | None] = [None] * n if seed is None else list(seed_chain(seed, n)[0])
        self._parts = parts = PoolParts(
            self._executor,
            first_seeds,
            options,
            check_open=self._check_open,
            ready=self._ready_to_send,
            closed=lambda: self._closed,
        )
        self._slots, self._sender, self._receiver = parts.slots, parts.sender, parts.receiver
        self._whole = WholeBatchCalls(self, parts)

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> Self:
        """Build every env on the executor. Called by ``async with``; idempotent."""
        async with self._start_lock:
            if self._closed:
                raise PoolClosedError("this pool is closed")
            if self._started:
                return self
            try:
                self._batcher = await self._parts.start(self._env_fns, self._make_kwargs, self._stack)
            except BaseException:
                self._closed = True
                raise
            self._loop = asyncio.get_running_loop()
            self._started = True
            self._started_at = time.perf_counter()
        return self

    async def aclose(self) -> None:
        """Stop every worker the pool started and free what it holds. Idempotent.

        From an event loop other than the pool's own (which may be gone), the workers are
        killed at once instead: the pool's tasks and futures live on its own loop.
        """
        if self._closed and not self._started:
            return
        self._closed = True
        if self._started and asyncio.get_running_loop() is not self._loop:
            self.kill()
            return
        await self._parts.stop_sending()
        if self._started:
            self._started = False
            await self._parts.stop_workers()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def kill(self) -> None:
        """Close the pool now, from synchronous code: kill every worker it started, without
        waiting for them (for finalizers and ``__del__``; :meth:`aclose` stops them gracefully).
        Idempotent."""
        self._closed = True
        started, self._started = self._started, False
        self._parts.kill(started)

    def __del__(self) -> None:
        if getattr(self, "_started", False) and not self._closed:
            self._executor.kill()  # first: with warnings as errors, the warning would stop it
            warnings.warn(f"{self!r} was not closed; its workers were killed", ResourceWarning, stacklevel=1)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running" if self._started else "not started"
        return f"AsyncEnvPool(num_envs={self.num_envs}, executor={self._executor.name!r}, {state})"

    # -- properties ------------------------------------------------------------------

    @property
    def num_envs(self) -> int:
        return len(self._env_fns)

    @property
    def batch_size(self) -> torch.Size:
        """``[num_envs]``, or ``[num_envs, *batch_shape]`` for members with a batch shape of
        their own (TorchRL envs of batch size ``[3]``; known once the pool started)."""
        batch_shape = self._batcher.batch_shape if self._batcher is not None else ()
        return torch.Size([self.num_envs, *batch_shape])

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def executor(self) -> Executor:
        return self._executor

    @property
    def env_specs(self) -> list[EnvSpec]:
        """Per env: its observation, action and reward spaces (and the leaves they lay out)."""
        self._check_open()
        return list(self._sender.specs)

    @property
    def env_states(self) -> list[EnvState]:
        """Per env: VOID, INIT, RESET, RUN, DONE or ERROR."""
        self._parts.drain()
        return list(self._slots.states)

    @property
    def is_dense(self) -> bool:
        """Whether batches are dense TensorDicts (else lazy stacks)."""
        return self._batcher_or_raise().dense

    @property
    def on_timeout(self) -> OnTimeout:
        """``"raise"`` or ``"truncate"`` (then every step result has ``("next", "timed_out")``)."""
        return self._parts.options.on_timeout

    def stats(self) -> PoolStats:
        """Per env step counts and latencies, in-flight and ready counts, throughput."""
        return self._parts.stats(self._started_at)

    # -- checks ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("this pool is closed")
        if not self._started:
            raise RuntimeError("the pool is not started: use `async with pool:` or `await pool.start()`")

    def _batcher_or_raise(self) -> Batcher:
        self._check_open()
        assert self._batcher is not None
        return self._batcher

    def _ready_to_send(self) -> Batcher:
        """The batcher, once the pool is checked open and on its own loop."""
        if self._closed or not self._started:
            self._check_open()
        if (running := asyncio.get_running_loop()) is not self._loop:
            raise other_loop_error(self._loop, running)
        assert self._batcher is not None
        return self._batcher

    # -- sending ---------------------------------------------------------------------

    async def async_step_send(self, td: TensorDictBase, env_index: EnvIndex | None = None) -> None:
        """Dispatch one step to each env of ``td`` (its ``"env_index"``, ``env_index=``, or all).

        Returns once the actions are dispatched. Raises EnvBusyError for an env with a
        command in flight or a result not yet received, ValueError for actions that do
        not fit the env's action space; nothing is dispatched then.
        """
        await self._parts.settle(td, env_index, whole=False)
        self._sender.send_actions(_STEP, td, env_index)

    async def async_step_and_maybe_reset_send(
        self, td: TensorDictBase, env_index: EnvIndex | None = None
    ) -> None:
        """Like :meth:`async_step_send`, and envs whose episode ends are reset in the same round trip."""
        await self._parts.settle(td, env_index, whole=False)
        self._sender.send_actions(_SMR, td, env_index)

    async def async_reset_send(
        self,
        td: TensorDictBase | None = None,
        *,
        env_index: EnvIndex | None = None,
        seed: Seed = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Dispatch a reset to some envs (``env_index``, ``td["env_index"]`` or all).

        ``seed``: an int starts TorchRL's seed chain over the envs reset, a sequence gives
        one seed per env. Without it, an env's first reset uses the pool's ``seed``.
        """
        check_options(options)  # before a collector holding the pool is stopped for it
        await self._parts.settle(td, env_index, whole=False)
        self._sender.send_reset(td, env_index, seed, options)

    # -- receiving -------------------------------------------------------------------

    async def async_step_recv(
        self,
        min_get: int | None = None,
        max_get: int | None = None,
        *,
        env_index: EnvIndex | None = None,
        timeout: float | None = None,
    ) -> TensorDictBase:
        """Collect finished steps: at least ``min_get`` (default 1), at most ``max_get``.

        With ``env_index``, waits for those envs (all of them unless ``min_get`` says
        otherwise) and returns them in that order; otherwise results come sorted by env
        index. ``timeout`` bounds the whole call: on expiry TimeoutError is raised and
        every result stays ready for the next call, as on cancellation.

        Returns:
            batch [k] in TorchRL's layout: the sent entries at the root, results under "next".
        """
        whole = await self._receiver.take_whole(_STEP, min_get, max_get, env_index, timeout)
        if whole is not None:  # a lockstep batch, answered plainly
            return self._batcher_or_raise().step_whole(self._slots.pop_inputs_of(whole))
        picked = await self._receiver.recv(_STEP, min_get, max_get, env_index, timeout)
        if not picked:
            return self._batcher_or_raise().empty()
        return self._batcher_or_raise().step_batch(picked, self._slots.pop_inputs(picked))

    async def async_step_and_maybe_reset_recv(
        self,
        min_get: int | None = None,
        max_get: int | None = None,
        *,
        env_index: EnvIndex | None = None,
        timeout: float | None = None,
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Collect finished step-and-resets: ``(out, next_td)`` as :meth:`step_and_maybe_reset`."""
        whole = await self._receiver.take_whole(_SMR, min_get, max_get, env_index, timeout)
        if whole is not None:
            return self._batcher_or_raise().step_and_reset_whole(self._slots.pop_inputs_of(whole))
        picked = await self._receiver.recv(_SMR, min_get, max_get, env_index, timeout)
        batcher = self._batcher_or_raise()
        if not picked:
            return batcher.empty(), batcher.empty()
        return batcher.step_and_reset_batch(picked, self._slots.pop_inputs(picked))

    async def async_reset_recv(
        self,
        min_get: int | None = None,
        max_get: int | None = None,
        *,
        env_index: EnvIndex | None = None,
        timeout: float | None = None,
    ) -> TensorDictBase:
        """Collect finished resets, with the same rules as :meth:`async_step_recv`."""
        picked = await self._receiver.recv(_RESET, min_get, max_get, env_index, timeout)
        batcher = self._batcher_or_raise()
        return batcher.reset_batch(picked) if picked else batcher.empty()

    # -- whole-batch calls: with "_step" / "_reset" masks; abandoned when cancelled ------

    async def reset(
        self,
        td: TensorDictBase | None = None,
        *,
        env_index: EnvIndex | None = None,
        seed: Seed = None,
        options: Mapping[str, Any] | None = None,
    ) -> TensorDictBase:
        """Reset some envs (default all) and return their first observations, in that order.

        With ``"_reset"`` entries in ``td`` (root, shaped like ``"done"``, or nested beside
        a nested ``"done"``), only the envs (or groups) marked are reset and the output is
        ``td`` with the reset values where marked, as TorchRL's partial resets. Envs reset
        for some of their groups get the groups' masks as ``options["_reset"]``.

        Example:
            >>> async def main():
            ...     async with AsyncEnvPool("CartPole-v1", num_envs=2, executor="inline") as pool:
            ...         td = await pool.reset()
            ...         td["_reset"] = torch.tensor([[True], [False]])
            ...         out = await pool.reset(td)  # env 0 reset, env 1 keeps its observation
            ...     return torch.equal(out["observation"][1], td["observation"][1])
            >>> asyncio.run(main())
            True
        """
        return await self._whole.reset(td, env_index, seed, options)

    async def step(self, td: TensorDictBase, env_index: EnvIndex | None = None) -> TensorDictBase:
        """Step every env of ``td`` and return their results, in the order of ``td``.

        With a ``"_step"`` entry (bool, ``[B]``) only the envs marked are stepped; the
        ``"next"`` entries of the others are their input values (0 where absent).
        """
        return await self._whole.step(td, env_index)

    async def step_and_maybe_reset(
        self, td: TensorDictBase, env_index: EnvIndex | None = None
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Step every env of ``td``; envs whose episode ended are reset.

        A ``"_step"`` entry steps only the envs marked, as in :meth:`step`; the others
        carry their input over to ``next_td`` (and are reset if their input is done).

        Returns:
            ``(out, next_td)``: ``out`` as :meth:`step` gives it, ``next_td`` the input of
            the next step (the next observations, or the reset ones where an episode ended).
        """
        return await self._whole.step_and_maybe_reset(td, env_index)

    @property
    def has_abandoned(self) -> bool:
        """Whether whole-batch calls that were interrupted (cancelled, Ctrl-C) left results due.

        Their envs are busy until those results arrive and are dropped: the next whole-batch
        call does it by itself, :meth:`drop_abandoned` does it now.
        """
        return bool(self._parts.abandoned.commands)

    async def drop_abandoned(self) -> None:
        """Wait for the results that interrupted whole-batch calls left due, and drop them."""
        await self._parts.abandoned.settle()

    # -- loops over whole batches (aenvs._pool.rollout) ----------------------------------

    def rand_action(
        self, td: TensorDictBase | None = None, *, generator: torch.Generator | None = None
    ) -> TensorDictBase:
        """Random actions from the envs' action spaces (torch's RNG, or ``generator``).

        Writes them into ``td`` (its ``"env_index"`` rows, or every env) and returns it, as
        TorchRL does; without ``td``, returns a new TensorDict of actions.
        """
        return _rand_action(self, td, generator=generator)

    async def rand_step(self, td: TensorDictBase | None = None) -> TensorDictBase:
        """:meth:`step` with random actions (written into ``td`` when given)."""
        return await self.step(self.rand_action(td))

    async def rollout(
        self,
        max_steps: int,
        policy: Callable[[TensorDictBase], TensorDictBase | None] | None = None,
        callback: Callable[[AsyncEnvPool, TensorDictBase], Any] | None = None,
        *,
        auto_reset: bool = True,
        break_when_any_done: bool | None = None,
        break_when_all_done: bool | None = None,
        return_contiguous: bool = True,
        tensordict: TensorDictBase | None = None,
    ) -> TensorDictBase:
        """Run up to ``max_steps`` steps of every env, as TorchRL's ``EnvBase.rollout``.

        Args:
            max_steps: steps to take.
            policy: called with the TensorDict of the current step; writes (or returns)
                the action entries. Default: random actions (:meth:`rand_action`).
            callback: called as ``callback(pool, td)`` after each step.
            auto_reset: reset every env first (with ``tensordict`` if given); else start
                from ``tensordict``, resetting the envs that are done in it.
            break_when_any_done: stop after the step where any env is done (the default).
            break_when_all_done: keep stepping the envs that are not done (partial steps,
                done envs repeat their last transition) until all are done.
                With neither, done envs are reset and the rollout runs ``max_steps`` steps.
            return_contiguous: stack densely where possible (else a lazy stack).
            tensordict: the start, for ``auto_reset=False``.

        Returns:
            batch ``[num_envs, T]``, the last dim named ``"time"``.

        Example:
            >>> async def main():
            ...     async with AsyncEnvPool("CartPole-v1", num_envs=4, executor="inline") as pool:
            ...         return await pool.rollout(100, break_when_any_done=False)
            >>> traj = asyncio.run(main())
            >>> traj.batch_size, traj.names
            (torch.Size([4, 100]), [None, 'time'])
        """
        return await _rollout(
            self,
            max_steps,
            policy,
            callback,
            auto_reset=auto_reset,
            break_when_any_done=break_when_any_done,
            break_when_all_done=break_when_all_done,
            return_contiguous=return_contiguous,
            tensordict=tensordict,
        )

    # -- calls on the envs ---------------------------------------------------------------

    async def call(
        self, name: str, *args: Any, env_index: EnvIndex | None = None, **kwargs: Any
    ) -> list[Any]:
        """Call method ``name`` on each env (default all); one return value per env."""
        return await self._parts.visit(
            env_index, lambda indices: Command(CommandKind.CALL, indices, name=name, args=args, kwargs=kwargs)
        )

    async def get_attr(self, name: str, *, env_index: EnvIndex | None = None) -> list[Any]:
        """Attribute ``name`` of each env (default all), looked up through gymnasium wrappers."""
        return await self._parts.visit(
            env_index, lambda indices: Command(CommandKind.GET_ATTR, indices, name=name)
        )

    async def set_attr(self, name: str, value: Any, *, env_index: EnvIndex | None = None) -> None:
        """Set attribute ``name`` of each env (default all)."""
        await self._parts.visit(
            env_index, lambda indices: Command(CommandKind.SET_ATTR, indices, name=name, args=(value,))
        )

    async def set_seed(self, seed: int) -> int:
        """Seed every env along TorchRL's seed chain (env 0 gets ``seed``); return the next seed.

        Each env is reset with its seed (and its action space seeded) at once, as TorchRL's
        ``set_seed`` does; the next :meth:`reset` continues from there.
        """
        return await self._parts.seed(seed)
