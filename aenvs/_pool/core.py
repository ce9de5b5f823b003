"""AsyncEnvPool: many envs, stepped by awaiting, on a pluggable executor.

The pool is policy: env slots and their states, ``env_index`` routing, batching
(``min_get`` / ``max_get``), stacking and the error model live here, once. The
executor is mechanism: it runs the envs and hands completions back.

A receive is cancellation-safe by construction: it waits (``wait_ready``, which
consumes nothing) and then harvests synchronously, so a timeout or a cancel can
only land where nothing has been taken yet.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Self

import numpy as np
import torch
from tensordict import TensorDictBase

from aenvs import _masks as masks
from aenvs._batching import Batcher, Inputs, shallow_copy
from aenvs._cancellation import cancellation_requested
from aenvs._commands import TRANSITIONS, Command, CommandKind, Completion, RemoteError
from aenvs._env import EnvFn, EnvState
from aenvs._errors import EnvBusyError, EnvError, PoolClosedError
from aenvs._indices import read_env_index
from aenvs._pool.masked import masked_reset, masked_step
from aenvs._pool.receives import Receive, WaitingReceives
from aenvs._pool.restarts import RestartSupervisor
from aenvs._pool.rollout import rand_action as _rand_action, rollout as _rollout
from aenvs._pool.stats import PoolStats
from aenvs._seeding import seed_chain
from aenvs._specs import EnvSpec
from aenvs.executors import Executor, make_executor

__all__ = ["AsyncEnvPool", "PoolStats", "StackMode"]

StackMode = Literal["dense", "lazy", "auto"]
EnvIndex = int | Sequence[int] | torch.Tensor

_STEP, _RESET, _SMR = CommandKind.STEP, CommandKind.RESET, CommandKind.STEP_AND_RESET
_RUN, _DONE = EnvState.RUN, EnvState.DONE
_TD_ENV_INDEX = "the input's 'env_index' entry"


def _normalize_env_fns(env_fns: EnvFn | Sequence[EnvFn], num_envs: int | None) -> list[EnvFn]:
    if isinstance(env_fns, str) or callable(env_fns):
        if num_envs is None:
            num_envs = 1
        fns = [env_fns] * num_envs
    else:
        fns = list(env_fns)
        if num_envs is not None and num_envs != len(fns):
            raise ValueError(f"num_envs={num_envs} but {len(fns)} env_fns were given")
    if not fns:
        raise ValueError("a pool needs at least one env")
    return fns


class AsyncEnvPool:
    """A pool of RL envs whose commands are awaited on the event loop.

    Args:
        env_fns: zero-argument callables (or callables taking an :class:`EnvContext`)
            returning a gymnasium env or an :class:`aenvs.Env`, or gymnasium ids; or one
            of those with ``num_envs``.
        num_envs: how many envs to build from a single ``env_fns``.
        executor: ``"inline"``, ``"thread"`` or an :class:`~aenvs.executors.Executor`.
        stack: ``"dense"`` (every env has the same keys and shapes), ``"lazy"``
            (``LazyStackedTensorDict``) or ``"auto"`` (dense when possible).
        envs_per_worker / num_workers: how the executor groups envs into workers.
        seed: seeds the envs' first reset with TorchRL's seed chain (and ``EnvContext.seed``).
        make_kwargs: keyword arguments for ``gymnasium.make`` of id strings (one dict, or one per env).
        on_error: ``"raise"`` (an env's failure is an EnvError; the env goes to ERROR) or
            ``"restart"`` (the same EnvError, and the env is then rebuilt from its factory in
            the background, its worker replaced if it died or hung; it needs a reset after).
        max_restarts: restarts allowed per env; past it the env stays in ERROR and every
            later send to it fails at once.
        restart_backoff: seconds before an env's first restart, doubled for each next one
            (at most 30 s).
        step_timeout / reset_timeout: seconds a step / reset may take; a command that
            outlives it is an EnvTimeoutError and its worker is stopped (killed, or abandoned
            for a thread) and, with ``on_error="restart"``, replaced.
        startup_timeout: seconds the executor may take to build every env.
        close_timeout: seconds ``aclose`` waits for workers to stop before killing them.
        check_finite: make a result with NaN or inf in a float entry an EnvError for its
            env (the other envs' results are delivered); off by default, as it costs a
            pass over every result.

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
    ) -> None:
        if stack not in ("dense", "lazy", "auto"):
            raise ValueError(f"stack must be 'dense', 'lazy' or 'auto', got {stack!r}")
        if on_error not in ("raise", "restart"):
            raise ValueError(f"on_error must be 'raise' or 'restart', got {on_error!r}")
        for name, value in (
            ("max_restarts", max_restarts),
            ("restart_backoff", restart_backoff),
            ("step_timeout", step_timeout),
            ("reset_timeout", reset_timeout),
            ("startup_timeout", startup_timeout),
            ("close_timeout", close_timeout),
        ):
            if value is not None and value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        self._env_fns = _normalize_env_fns(env_fns, num_envs)
        n = len(self._env_fns)
        self._all_envs = list(range(n))
        self._executor = make_executor(executor, envs_per_worker=envs_per_worker, num_workers=num_workers)
        if startup_timeout is not None:
            self._executor.startup_timeout = startup_timeout
        if close_timeout is not None:
            self._executor.close_timeout = close_timeout
        capabilities = self._executor.capabilities
        if (step_timeout is not None or reset_timeout is not None) and not capabilities.abort:
            raise ValueError(
                f"step_timeout / reset_timeout need an executor that can stop a command in flight; "
                f"the {self._executor.name} executor cannot (its capabilities: {capabilities})"
            )
        self._on_error = on_error
        self._check_finite = check_finite
        self._timeouts: dict[CommandKind, float | None] = {
            _STEP: step_timeout,
            _SMR: step_timeout,
            _RESET: reset_timeout,
        }
        self._stack: StackMode = stack
        if make_kwargs is None or isinstance(make_kwargs, Mapping):
            self._make_kwargs = {i: make_kwargs or {} for i in range(n)}
        else:
            if len(make_kwargs) != n:
                raise ValueError(f"make_kwargs has {len(make_kwargs)} entries for {n} envs")
            self._make_kwargs = dict(enumerate(make_kwargs))
        self._first_seeds: list[int | None] = [None] * n
        if seed is not None:
            self._first_seeds = list(seed_chain(seed, n)[0])
        self._started = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop the pool started on, its own
        self._specs: list[EnvSpec] = []
        self._batcher: Batcher | None = None
        self._states = [EnvState.VOID] * n
        self._pending: list[CommandKind | None] = [None] * n
        self._ready: dict[int, Completion] = {}
        self._inputs: list[TensorDictBase | None] = [None] * n  # the batch each env's step came in
        self._input_rows = [0] * n  # ... and its row there
        self._answers: dict[int, Completion] = {}
        self._orphans: set[int] = set()
        # whole-batch commands whose caller was cancelled: env -> (kind, when); dropped on arrival
        self._abandoned: dict[int, tuple[CommandKind, float]] = {}
        self._outstanding: Counter[CommandKind] = Counter()
        self._in_flight = 0
        self._sent_at = [0.0] * n
        self._steps = [0] * n
        self._latency_sum = [0.0] * n
        self._latency_last = [0.0] * n
        self._errors = [0] * n
        self._started_at = 0.0
        self._start_lock = asyncio.Lock()
        self._timed_out: dict[int, float] = {}  # env -> the timeout its command outlived
        self._timeout_counts = [0] * n
        self._restarts = RestartSupervisor(
            self._executor,
            num_envs=n,
            max_restarts=max_restarts,
            backoff=restart_backoff,
            is_free=self._is_free,
            rebuild_in_place=self._rebuild_in_place,
            rebuilt=self._mark_rebuilt,
            broke=self._mark_broken,
        )
        self._receives = WaitingReceives(self._outstanding, self._ready, self._pending)

    # -- lifecycle ------------------------------------------------------------------

    async def start(self) -> Self:
        """Build every env on the executor. Called by ``async with``; idempotent."""
        async with self._start_lock:
            if self._closed:
                raise PoolClosedError("this pool is closed")
            if self._started:
                return self
            try:
                specs = await self._executor.start(
                    self._env_fns, seeds=self._first_seeds, make_kwargs=self._make_kwargs
                )
            except BaseException as exc:
                self._closed = True
                if isinstance(exc, EnvError) and not exc.executor:
                    exc.executor = self._executor.name
                raise
            try:
                buffers = self._executor.buffers
                assert buffers is not None
                self._batcher = Batcher(specs, buffers, dense=self._resolve_dense(specs))
            except BaseException:
                self._closed = True
                try:
                    await self._executor.aclose()
                finally:
                    self._executor.kill()
                raise
            self._specs = specs
            self._states = [EnvState.INIT] * self.num_envs
            self._loop = asyncio.get_running_loop()
            self._started = True
            self._started_at = time.perf_counter()
        return self

    def _resolve_dense(self, specs: Sequence[EnvSpec]) -> bool:
        if self._stack == "lazy":
            return False
        for i, spec in enumerate(specs[1:], start=1):
            difference = specs[0].layout_difference(spec)
            if difference is not None:
                if self._stack == "dense":
                    raise ValueError(
                        f"stack='dense' needs every env to share keys and shapes, but env {i} differs "
                        f"from env 0: {difference}; use stack='lazy' or 'auto'"
                    )
                return False
        return True

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
        self._executor.wake()
        await self._restarts.aclose()
        if self._started:
            self._started = False
            try:
                await self._executor.aclose()
            finally:
                self._executor.kill()
                self._states = [EnvState.VOID] * self.num_envs
                self._ready.clear()
                self._inputs = [None] * self.num_envs

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def kill(self) -> None:
        """Close the pool now, from synchronous code: kill every worker it started, without
        waiting for them (for finalizers and ``__del__``; :meth:`aclose` stops them gracefully).
        Idempotent."""
        self._closed = True
        if self._started:
            self._started = False
            self._restarts.forget()
            self._executor.kill()
            self._states = [EnvState.VOID] * self.num_envs

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
        return torch.Size([self.num_envs])

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
        return list(self._specs)

    @property
    def env_states(self) -> list[EnvState]:
        """Per env: VOID, INIT, RESET, RUN, DONE or ERROR."""
        self._drain()
        return list(self._states)

    @property
    def is_dense(self) -> bool:
        """Whether batches are dense TensorDicts (else lazy stacks)."""
        return self._batcher_or_raise().dense

    def stats(self) -> PoolStats:
        """Per env step counts and latencies, in-flight and ready counts, throughput."""
        self._drain()
        uptime = time.perf_counter() - self._started_at if self._started_at else 0.0
        return PoolStats(
            steps=list(self._steps),
            step_latency_mean=[
                s / n if n else 0.0 for s, n in zip(self._latency_sum, self._steps, strict=True)
            ],
            step_latency_last=list(self._latency_last),
            errors=list(self._errors),
            in_flight=self._in_flight,
            ready=len(self._ready),
            steps_per_second=sum(self._steps) / uptime if uptime > 0 else 0.0,
            uptime=uptime,
            restarts=list(self._restarts.counts),
            timeouts=list(self._timeout_counts),
            abandoned_threads=self._executor.counters().get("abandoned_threads", 0),
            receiving=len(self._receives.waiting),
            in_flight_envs=[i for i, kind in enumerate(self._pending) if kind is not None],
        )

    # -- checks ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosedError("this pool is closed")
        if not self._started:
            raise RuntimeError("the pool is not started: use `async with pool:` or `await pool.start()`")

    def _check_loop(self) -> None:
        """Refuse a coroutine of the pool run on an event loop other than the one it started on."""
        running = asyncio.get_running_loop()
        if running is not self._loop and self._started:
            raise RuntimeError(
                f"this pool was started on another event loop ({self._loop!r}, now "
                f"{'closed' if self._loop is not None and self._loop.is_closed() else 'not this one'}) "
                f"than the one running this call ({running!r}): a pool belongs to the loop it started "
                "on, where its executor delivers results. Use it from that loop, or build one pool per "
                "loop (synchronous code: aenvs.SerialEnv / ParallelEnv keep one loop for you)"
            )

    def _batcher_or_raise(self) -> Batcher:
        self._check_open()
        assert self._batcher is not None
        return self._batcher

    def _indices(self, env_index: EnvIndex | None, name: str = "env_index") -> list[int] | None:
        if env_index is None:
            return None
        indices = read_env_index(env_index, self.num_envs, name)
        if indices == self._all_envs:
            return self._all_envs  # shared, never mutated
        if not indices:
            raise ValueError(f"{name} is empty: it names no env (a call needs at least one)")
        if indices and (min(indices) < 0 or max(indices) >= self.num_envs):
            bad = next(i for i in indices if not 0 <= i < self.num_envs)
            raise IndexError(f"{name}: env index {bad} is out of range for a pool of {self.num_envs} envs")
        if len(set(indices)) != len(indices):
            seen: set[int] = set()
            bad = next(i for i in indices if i in seen or seen.add(i))
            raise ValueError(f"{name}: env index {bad} appears more than once")
        return indices

    def _targets(self, td: TensorDictBase | None, env_index: EnvIndex | None) -> list[int]:
        indices = self._indices(env_index)
        if indices is None and td is not None:
            indices = self._indices(td.get("env_index", None), _TD_ENV_INDEX)
        if indices is None:
            if td is not None and td.batch_size[:1] != self.batch_size:
                raise ValueError(
                    f"the input has batch size {tuple(td.batch_size)} and no 'env_index' entry; "
                    f"pass env_index= or a batch of {self.num_envs}"
                )
            indices = self._all_envs
        if td is not None and tuple(td.batch_size[:1]) != (len(indices),):
            raise ValueError(
                f"the input has batch size {tuple(td.batch_size)} for {len(indices)} env indices"
            )
        pending, ready, answers, orphans = self._pending, self._ready, self._answers, self._orphans
        for i in indices:
            if pending[i] is not None or i in ready or i in answers or i in orphans:
                raise EnvBusyError(i)
        if self._restarts.broken:
            self._restarts.check_not_broken(indices, self._executor.name)
        return indices

    # -- sending ---------------------------------------------------------------------

    def _dispatch(self, command: Command) -> None:
        now = time.perf_counter()
        kind, pending, sent_at = command.kind, self._pending, self._sent_at
        for i in command.env_indices:
            pending[i] = kind
            sent_at[i] = now
        self._in_flight += len(command.env_indices)
        if kind in TRANSITIONS:
            self._outstanding[kind] += len(command.env_indices)
            limit = self._timeouts[kind]
            if limit is not None:
                asyncio.get_running_loop().call_later(limit, self._expire, command.env_indices, now, limit)
        self._executor.submit(command)

    def _expire(self, indices: list[int], sent_at: float, limit: float) -> None:
        """A timeout fired: stop the workers of the envs still running that command."""
        if self._closed:
            return
        self._drain()  # what already arrived is not late
        stuck = [i for i in indices if self._pending[i] is not None and self._sent_at[i] == sent_at]
        if not stuck:
            return
        for i in stuck:
            self._timed_out[i] = limit
            self._timeout_counts[i] += 1
        # the executor answers every command of the stopped workers with a crash; _drain
        # turns the stuck envs' ones into EnvTimeoutError
        self._executor.abort(stuck)

    def _send_actions(self, kind: CommandKind, td: TensorDictBase, env_index: EnvIndex | None) -> list[int]:
        batcher = self._batcher_or_raise()
        self._check_loop()
        if not isinstance(td, TensorDictBase):
            raise TypeError(f"expected a TensorDict of actions, got {type(td).__name__}")
        indices = self._targets(td, env_index)
        batcher.check_actions(td, indices)
        batcher.write_actions(td, indices)
        stored = shallow_copy(td)  # later key changes by the caller do not reach the results
        # batch and row in two lists, not a tuple per env: per-step objects that live as long
        # as a step are what sets off CPython's full garbage collections
        inputs, rows = self._inputs, self._input_rows
        for row, i in enumerate(indices):
            inputs[i] = stored
            rows[i] = row
        self._dispatch(Command(kind, indices))
        return indices

    async def async_step_send(self, td: TensorDictBase, env_index: EnvIndex | None = None) -> None:
        """Dispatch one step to each env of ``td`` (its ``"env_index"``, ``env_index=``, or all).

        Returns once the actions are dispatched. Raises EnvBusyError for an env with a
        command in flight or a result not yet received, ValueError for actions that do
        not fit the env's action space; nothing is dispatched then.
        """
        if self._restarts.active:
            await self._settle(td, env_index, whole=False)
        self._send_actions(_STEP, td, env_index)

    async def async_step_and_maybe_reset_send(
        self, td: TensorDictBase, env_index: EnvIndex | None = None
    ) -> None:
        """Like :meth:`async_step_send`, and envs whose episode ends are reset in the same round trip."""
        if self._restarts.active:
            await self._settle(td, env_index, whole=False)
        self._send_actions(_SMR, td, env_index)

    async def async_reset_send(
        self,
        td: TensorDictBase | None = None,
        *,
        env_index: EnvIndex | None = None,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Dispatch a reset to some envs (``env_index``, ``td["env_index"]`` or all).

        ``seed``: an int starts TorchRL's seed chain over the envs reset, a sequence gives
        one seed per env. Without it, an env's first reset uses the pool's ``seed``.
        """
        if self._restarts.active:
            await self._settle(td, env_index, whole=False)
        self._send_reset(td, env_index, seed, options)

    def _send_reset(
        self,
        td: TensorDictBase | None,
        env_index: EnvIndex | None,
        seed: int | Sequence[int | None] | None,
        options: Mapping[str, Any] | None,
    ) -> list[int]:
        self._batcher_or_raise()
        self._check_loop()
        indices = self._targets(td, env_index)
        if seed is None:
            seeds = [self._first_seeds[i] for i in indices]
        elif isinstance(seed, int):
            seeds = seed_chain(seed, len(indices))[0]
        else:
            seeds = list(seed)
            if len(seeds) != len(indices):
                raise ValueError(f"{len(seeds)} seeds for {len(indices)} envs")
        for i in indices:
            self._first_seeds[i] = None
            self._states[i] = EnvState.RESET
        seeds_by_env = dict(zip(indices, seeds, strict=True))
        self._dispatch(
            Command(_RESET, indices, seeds=seeds_by_env, options=dict(options) if options else None)
        )
        return indices

    # -- receiving -------------------------------------------------------------------

    def _drain(self) -> None:
        completions = self._executor.poll()
        if not completions:
            return
        now = time.perf_counter()
        # runs for every completion: attributes looked up once, kinds compared by identity
        pending, ready, states, sent_at = self._pending, self._ready, self._states, self._sent_at
        steps, latency_sum, latency_last = self._steps, self._latency_sum, self._latency_last
        for c in completions:
            i, kind = c.env_index, c.kind
            if pending[i] is None:  # an answer for a command abandoned by close
                continue
            pending[i] = None
            self._in_flight -= 1
            if self._check_finite and c.error is None and kind in TRANSITIONS:
                self._check_result_finite(c)
            if c.error is not None:
                self._on_failure(c)
            if kind is not _STEP and kind is not _SMR and kind is not _RESET:  # not in TRANSITIONS
                if c.error is not None:
                    self._errors[i] += 1
                if i in self._orphans:  # its caller was cancelled
                    self._orphans.discard(i)
                else:
                    self._answers[i] = c
                continue
            ready[i] = c
            if c.error is not None:
                self._errors[i] += 1
                states[i] = EnvState.ERROR
                continue
            if kind is _RESET:
                states[i] = _RUN
                continue
            latency = now - sent_at[i]
            steps[i] += 1
            latency_sum[i] += latency
            latency_last[i] = latency
            states[i] = _DONE if c.done and not c.was_reset else _RUN

    def _check_result_finite(self, c: Completion) -> None:
        """Turn a result holding NaN or inf (in its buffer rows) into an error for its env."""
        buffers = self._executor.buffers
        assert buffers is not None
        rows = buffers.rows(c.env_index)
        parts = [rows.reset] if c.kind is _RESET else [rows.step, rows.reset] if c.was_reset else [rows.step]
        for part in parts:
            for key, view in part.items():
                if view.dtype.kind in "fc" and not np.isfinite(view).all():
                    name = ".".join(key)
                    c.error = RemoteError(
                        "builtins.ValueError",
                        f"ValueError: env {c.env_index} returned NaN or inf in {name!r} (check_finite=True)\n",
                    )
                    return

    def _on_failure(self, c: Completion) -> None:
        """A command failed: name a timeout as such, and queue a restart if the pool does that."""
        i, error = c.env_index, c.error
        assert error is not None
        limit = self._timed_out.pop(i, None)
        if limit is not None and error.crashed:
            c.error = error = RemoteError.timed_out(
                f"env {i} did not finish its {c.kind.value} within {limit} s; its worker was stopped"
            )
        if self._on_error == "restart" and (c.kind in TRANSITIONS or error.crashed):
            self._restarts.failed(i)

    # -- what the restart supervisor asks of the pool

    def _is_free(self, i: int) -> bool:
        return self._pending[i] is None

    async def _rebuild_in_place(self, indices: list[int]) -> None:
        self._dispatch(Command(CommandKind.REBUILD, indices))
        await self._collect(indices, "rebuild")

    def _mark_rebuilt(self, i: int) -> None:
        if self._pending[i] is None:
            self._states[i] = EnvState.INIT

    def _mark_broken(self, i: int) -> None:
        self._states[i] = EnvState.ERROR

    async def _settle(self, td: TensorDictBase | None, env_index: EnvIndex | None, *, whole: bool) -> None:
        """Before a command: wait for the envs it goes to that are being restarted (never for
        the others), and, for a whole-batch call (``whole``), drop what abandoned calls left."""
        if whole and self._abandoned:
            await self._settle_abandoned()
        if self._restarts.active:
            indices = self._indices(env_index)
            if indices is None and td is not None and "env_index" in td.keys():
                indices = self._indices(td.get("env_index"), _TD_ENV_INDEX)
            await self._restarts.settle(self._all_envs if indices is None else indices)

    def _take(self, kind: CommandKind, wanted: list[int] | None, max_get: int | None) -> list[Completion]:
        """Pick ready results of ``kind`` (raising the first error among them); consumes nothing else."""
        picked: list[Completion] = []
        if wanted is None:
            for i, c in self._ready.items():
                if c.kind is kind:
                    if c.error is not None:
                        self._raise(i)
                    picked.append(c)
                    if max_get is not None and len(picked) >= max_get:
                        break
        else:
            for i in wanted:
                c = self._ready.get(i)
                if c is not None and c.kind is kind:
                    if c.error is not None:
                        self._raise(i)
                    picked.append(c)
                    if max_get is not None and len(picked) >= max_get:
                        break
        return picked

    def _raise(self, i: int) -> None:
        c = self._ready.pop(i)
        self._inputs[i] = None
        self._outstanding[c.kind] -= 1
        assert c.error is not None
        raise c.error.to_exception(i, c.kind.value, self._executor.name)

    def _consume(self, kind: CommandKind, picked: list[Completion]) -> None:
        ready = self._ready
        for c in picked:
            del ready[c.env_index]
        self._outstanding[kind] -= len(picked)

    def _take_beside_others(
        self, receive: Receive | None, kind: CommandKind, max_get: int | None
    ) -> list[Completion]:
        """:meth:`_take` for any env while other receives wait: leaves what they hold and claim."""
        limit = self._receives.spare(kind, receive)
        if max_get is not None:
            limit = min(limit, max_get)
        picked: list[Completion] = []
        if limit <= 0:
            return picked
        reserved = self._receives.reserved
        for i, c in self._ready.items():
            if c.kind is kind and i not in reserved:
                if c.error is not None:
                    self._raise(i)
                picked.append(c)
                if len(picked) >= limit:
                    break
        return picked

    def _wake_receives(self) -> None:
        """Results were dropped: let waiting receives check that they can still be satisfied."""
        if self._receives.waiting:
            self._executor.wake()

    async def _recv(
        self,
        kind: CommandKind,
        min_get: int | None,
        max_get: int | None,
        env_index: EnvIndex | None,
        timeout: float | None,
    ) -> list[Completion]:
        self._check_open()
        self._check_loop()
        if cancellation_requested():  # a call that never suspends still honours a cancel, here
            await asyncio.sleep(0)
        wanted = self._indices(env_index, "env_index")
        if wanted is not None:
            for i in wanted:
                if self._pending[i] is not kind and not (i in self._ready and self._ready[i].kind is kind):
                    raise ValueError(f"env {i} has no {kind.value} in flight or ready to receive")
            available = len(wanted)
        else:
            available = self._outstanding[kind]
        if min_get is None:
            min_get = len(wanted) if wanted is not None else 1
        if min_get < 0 or (max_get is not None and max_get < max(min_get, 1)):
            raise ValueError(f"need 0 <= min_get <= max_get and max_get >= 1, got {min_get=} {max_get=}")
        if min_get > available:
            raise ValueError(
                f"min_get={min_get} but only {available} {kind.value} result(s) are in flight or ready; "
                "this would wait forever"
            )
        waiting = self._receives.waiting
        shared = wanted is None and bool(waiting)  # others wait: take only what is not theirs
        if waiting:
            self._receives.check_beside_others(kind, wanted, min_get)
        self._drain()
        picked = (
            self._take_beside_others(None, kind, max_get) if shared else self._take(kind, wanted, max_get)
        )
        if len(picked) < min_get:
            self._executor.flush()  # about to wait: what the executor left for later can run now
            self._drain()
            picked = (
                self._take_beside_others(None, kind, max_get) if shared else self._take(kind, wanted, max_get)
            )
        if len(picked) < min_get:
            receiving = self._wait_for(Receive(kind, wanted, min_get), max_get)
            # wait_for, not asyncio.timeout: the sync shim runs a call's first step outside a task
            picked = await (receiving if timeout is None else asyncio.wait_for(receiving, timeout))
        else:
            self._consume(kind, picked)
        if wanted is None:
            picked.sort(key=lambda c: c.env_index)
        return picked

    async def _wait_for(self, receive: Receive, max_get: int | None) -> list[Completion]:
        """Wait until ``receive`` can take its results, and take them (consumed before returning,
        so that no other receive can pick them while this one's caller resumes)."""
        kind, wanted, min_get = receive.kind, receive.wanted, receive.min_get
        receives = self._receives
        receives.add(receive)
        try:
            while True:
                await self._executor.wait_ready()
                if self._closed:
                    raise PoolClosedError("the pool was closed while waiting")
                self._drain()
                receives.check_still_possible(receive)
                if wanted is None and len(receives.waiting) > 1:
                    picked = self._take_beside_others(receive, kind, max_get)
                else:
                    picked = self._take(kind, wanted, max_get)
                if len(picked) >= min_get:
                    self._consume(kind, picked)
                    return picked
        finally:
            receives.remove(receive)

    def _pop_inputs(self, picked: list[Completion]) -> list[Inputs]:
        inputs, rows = self._inputs, self._input_rows
        popped: list[Inputs] = []
        for c in picked:
            i = c.env_index
            td = inputs[i]
            assert td is not None
            popped.append((td, rows[i]))
            inputs[i] = None
        return popped

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
        picked = await self._recv(_STEP, min_get, max_get, env_index, timeout)
        if not picked:
            return self._batcher_or_raise().empty()
        return self._batcher_or_raise().step_batch(picked, self._pop_inputs(picked))

    async def async_step_and_maybe_reset_recv(
        self,
        min_get: int | None = None,
        max_get: int | None = None,
        *,
        env_index: EnvIndex | None = None,
        timeout: float | None = None,
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Collect finished step-and-resets: ``(out, next_td)`` as :meth:`step_and_maybe_reset`."""
        picked = await self._recv(_SMR, min_get, max_get, env_index, timeout)
        batcher = self._batcher_or_raise()
        if not picked:
            return batcher.empty(), batcher.empty()
        return batcher.step_and_reset_batch(picked, self._pop_inputs(picked))

    async def async_reset_recv(
        self,
        min_get: int | None = None,
        max_get: int | None = None,
        *,
        env_index: EnvIndex | None = None,
        timeout: float | None = None,
    ) -> TensorDictBase:
        """Collect finished resets, with the same rules as :meth:`async_step_recv`."""
        picked = await self._recv(_RESET, min_get, max_get, env_index, timeout)
        batcher = self._batcher_or_raise()
        return batcher.reset_batch(picked) if picked else batcher.empty()

    # -- whole-batch calls -------------------------------------------------------------
    #
    # These honour TorchRL's partial-step / partial-reset masks ("_step", "_reset"; the
    # semantics live in aenvs._masks) and, when cancelled (Ctrl-C in the sync shim, a task
    # cancel), abandon their command: its results are dropped when they arrive, so the
    # next whole-batch call finds the envs free instead of busy.

    async def reset(
        self,
        td: TensorDictBase | None = None,
        *,
        env_index: EnvIndex | None = None,
        seed: int | Sequence[int | None] | None = None,
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
        if self._abandoned or self._restarts.active:
            await self._settle(td, env_index, whole=True)
        if td is not None and masks.has_reset_mask(td):
            return await masked_reset(self, td, env_index, seed, options)
        indices = self._send_reset(td, env_index, seed, options)
        return await self._recv_or_abandon(_RESET, indices)

    async def step(self, td: TensorDictBase, env_index: EnvIndex | None = None) -> TensorDictBase:
        """Step every env of ``td`` and return their results, in the order of ``td``.

        With a ``"_step"`` entry (bool, ``[B]``) only the envs marked are stepped; the
        ``"next"`` entries of the others are their input values (0 where absent).
        """
        if self._abandoned or self._restarts.active:
            await self._settle(td, env_index, whole=True)
        if isinstance(td, TensorDictBase):
            keys = td.keys()
            if masks.STEP_KEY in keys or masks.RESET_KEY in keys:
                return (await masked_step(self, td, env_index, and_reset=False))[0]
        indices = self._send_actions(_STEP, td, env_index)
        return await self._recv_or_abandon(_STEP, indices)

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
        if self._abandoned or self._restarts.active:
            await self._settle(td, env_index, whole=True)
        if isinstance(td, TensorDictBase):
            keys = td.keys()
            if masks.STEP_KEY in keys or masks.RESET_KEY in keys:
                out, nxt = await masked_step(self, td, env_index, and_reset=True)
                assert nxt is not None
                return out, nxt
        indices = self._send_actions(_SMR, td, env_index)
        try:
            return await self.async_step_and_maybe_reset_recv(env_index=indices)
        except BaseException as exc:
            self._give_up(exc, _SMR, indices)
            raise

    async def _recv_or_abandon(self, kind: CommandKind, indices: list[int]) -> TensorDictBase:
        try:
            if kind is _RESET:
                return await self.async_reset_recv(env_index=indices)
            return await self.async_step_recv(env_index=indices)
        except BaseException as exc:
            self._give_up(exc, kind, indices)
            raise

    # -- abandoned commands --------------------------------------------------------------

    def _abandoned_commands(self) -> dict[int, tuple[CommandKind, float]]:
        """Env index -> (kind, dispatch time) of whole-batch commands whose caller gave up."""
        return self._abandoned

    def _give_up(self, exc: BaseException, kind: CommandKind, indices: Sequence[int]) -> None:
        """A whole-batch call ends without its results: cancelled, interrupted, or one env failed.

        Cancelled: the results still due are dropped when they arrive. An env failed: the
        other results stay ready for an ``async_*_recv``, and the next whole-batch call drops
        those still unreceived, so it finds every env free.
        """
        if not isinstance(exc, Exception):
            self._abandon(kind, indices)
        elif isinstance(exc, EnvError):
            self._abandon(kind, indices, drop_now=False)

    def _abandon(self, kind: CommandKind, indices: Sequence[int], *, drop_now: bool = True) -> None:
        abandoned = self._abandoned_commands()
        for i in indices:
            abandoned[i] = (kind, self._sent_at[i])
        if drop_now:
            self._discard_abandoned()

    def _discard_abandoned(self) -> bool:
        """Drop the results of abandoned commands that arrived; whether some are still due."""
        abandoned = self._abandoned_commands()
        if not abandoned:
            return False
        if self._closed:
            abandoned.clear()
            return False
        self._drain()
        for i, (kind, sent_at) in list(abandoned.items()):
            c = self._ready.get(i)
            if self._sent_at[i] != sent_at or (c is None and self._pending[i] is not kind):
                del abandoned[i]  # received by someone else, or superseded by a newer command
            elif c is not None and c.kind is kind:
                del self._ready[i]
                self._outstanding[kind] -= 1
                self._inputs[i] = None
                del abandoned[i]
                self._wake_receives()
        return bool(abandoned)

    async def _settle_abandoned(self) -> None:
        """Wait for the results of abandoned commands and drop them (the envs are free afterwards)."""
        while self._discard_abandoned():
            await self._executor.wait_ready()

    @property
    def has_abandoned(self) -> bool:
        """Whether whole-batch calls that were interrupted (cancelled, Ctrl-C) left results due.

        Their envs are busy until those results arrive and are dropped: the next whole-batch
        call does it by itself, :meth:`drop_abandoned` does it now.
        """
        return bool(self._abandoned)

    async def drop_abandoned(self) -> None:
        """Wait for the results that interrupted whole-batch calls left due, and drop them."""
        if self._abandoned:
            await self._settle_abandoned()

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

    async def _ask(self, command: Command) -> list[Any]:
        self._check_open()
        self._check_loop()
        self._dispatch(command)
        return await self._collect(command.env_indices, command.label())

    async def _collect(self, indices: list[int], label: str) -> list[Any]:
        """Wait for the answers of a call-like command to ``indices``; raise the first error."""
        if cancellation_requested():
            await asyncio.sleep(0)
        self._executor.flush()
        while not all(i in self._answers for i in indices):
            self._drain()
            if all(i in self._answers for i in indices):
                break
            try:
                await self._executor.wait_ready()
            except BaseException:
                # cancelled: answers still on their way are dropped when they arrive
                for i in indices:
                    if self._answers.pop(i, None) is None:
                        self._orphans.add(i)
                raise
            if self._closed:
                raise PoolClosedError("the pool was closed while waiting")
        answers = [self._answers.pop(i) for i in indices]
        for c in answers:
            if c.error is not None:
                raise c.error.to_exception(c.env_index, label, self._executor.name)
        return [c.value for c in answers]

    async def call(
        self, name: str, *args: Any, env_index: EnvIndex | None = None, **kwargs: Any
    ) -> list[Any]:
        """Call method ``name`` on each env (default all); one return value per env."""
        self._check_open()
        if self._restarts.active:
            await self._settle(None, env_index, whole=False)
        indices = self._targets(None, env_index)
        return await self._ask(Command(CommandKind.CALL, indices, name=name, args=args, kwargs=kwargs))

    async def get_attr(self, name: str, *, env_index: EnvIndex | None = None) -> list[Any]:
        """Attribute ``name`` of each env (default all), looked up through gymnasium wrappers."""
        self._check_open()
        if self._restarts.active:
            await self._settle(None, env_index, whole=False)
        indices = self._targets(None, env_index)
        return await self._ask(Command(CommandKind.GET_ATTR, indices, name=name))

    async def set_attr(self, name: str, value: Any, *, env_index: EnvIndex | None = None) -> None:
        """Set attribute ``name`` of each env (default all)."""
        self._check_open()
        if self._restarts.active:
            await self._settle(None, env_index, whole=False)
        indices = self._targets(None, env_index)
        await self._ask(Command(CommandKind.SET_ATTR, indices, name=name, args=(value,)))

    async def set_seed(self, seed: int) -> int:
        """Seed every env along TorchRL's seed chain (env 0 gets ``seed``); return the next seed.

        Each env is reset with its seed (and its action space seeded) at once, as TorchRL's
        ``set_seed`` does; the next :meth:`reset` continues from there.
        """
        self._check_open()
        if self._restarts.active:
            await self._settle(None, None, whole=False)
        indices = self._targets(None, None)
        seeds, after = seed_chain(seed, self.num_envs)
        await self._ask(Command(CommandKind.SEED, indices, seeds=dict(zip(indices, seeds, strict=True))))
        self._first_seeds = [None] * self.num_envs
        for i in indices:
            self._states[i] = EnvState.INIT
        return after
