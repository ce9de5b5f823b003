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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Self

import torch
from tensordict import TensorDictBase

from aenvs.batching import Batcher, Inputs
from aenvs.commands import TRANSITIONS, Command, CommandKind, Completion
from aenvs.env import EnvState
from aenvs.errors import EnvBusyError, PoolClosedError
from aenvs.executors import Executor, make_executor
from aenvs.gym import EnvFn
from aenvs.seeding import seed_chain
from aenvs.specs import EnvSpec

__all__ = ["AsyncEnvPool", "PoolStats", "StackMode"]

StackMode = Literal["dense", "lazy", "auto"]
EnvIndex = int | Sequence[int] | torch.Tensor

_STEP, _RESET, _SMR = CommandKind.STEP, CommandKind.RESET, CommandKind.STEP_AND_RESET


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of a pool's activity (``pool.stats()``).

    Attributes:
        steps: steps completed per env.
        step_latency_mean / step_latency_last: seconds from send to completion, per env
            (measured when the pool collects the completion).
        errors: failed commands per env.
        in_flight: commands sent whose completion has not arrived.
        ready: results arrived but not yet received.
        steps_per_second: completed steps over the time since the pool started.
    """

    steps: list[int]
    step_latency_mean: list[float]
    step_latency_last: list[float]
    errors: list[int]
    in_flight: int
    ready: int
    steps_per_second: float
    uptime: float


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

    Example:
        >>> async def main():
        ...     async with AsyncEnvPool(["CartPole-v1"] * 4, executor="thread") as pool:
        ...         td = await pool.reset()
        ...         td["action"] = torch.randint(0, 2, (4,))
        ...         await pool.async_step_send(td)
        ...         out = await pool.async_step_recv(min_get=2)
        ...         return out["next", "reward"].shape[0] >= 2
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
    ) -> None:
        if stack not in ("dense", "lazy", "auto"):
            raise ValueError(f"stack must be 'dense', 'lazy' or 'auto', got {stack!r}")
        self._env_fns = _normalize_env_fns(env_fns, num_envs)
        n = len(self._env_fns)
        self._all_envs = list(range(n))
        self._executor = make_executor(executor, envs_per_worker=envs_per_worker, num_workers=num_workers)
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
        self._specs: list[EnvSpec] = []
        self._batcher: Batcher | None = None
        self._states = [EnvState.VOID] * n
        self._pending: list[CommandKind | None] = [None] * n
        self._ready: dict[int, Completion] = {}
        self._inputs: list[Inputs | None] = [None] * n
        self._answers: dict[int, Completion] = {}
        self._orphans: set[int] = set()
        self._outstanding: Counter[CommandKind] = Counter()
        self._in_flight = 0
        self._sent_at = [0.0] * n
        self._steps = [0] * n
        self._latency_sum = [0.0] * n
        self._latency_last = [0.0] * n
        self._errors = [0] * n
        self._started_at = 0.0
        self._start_lock = asyncio.Lock()

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
            except BaseException:
                self._closed = True
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
        """Stop every worker the pool started and free what it holds. Idempotent."""
        if self._closed and not self._started:
            return
        self._closed = True
        self._executor.wake()
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

    def __del__(self) -> None:
        if getattr(self, "_started", False) and not self._closed:
            warnings.warn(f"{self!r} was not closed; killing its workers", ResourceWarning, stacklevel=1)
            self._executor.kill()

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
        )

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

    def _indices(self, env_index: EnvIndex | None) -> list[int] | None:
        if env_index is None:
            return None
        if isinstance(env_index, torch.Tensor):
            indices = env_index.tolist() if env_index.dim() == 1 else env_index.reshape(-1).tolist()
        elif isinstance(env_index, int):
            indices = [env_index]
        else:
            indices = [int(i) for i in env_index]
        if indices == self._all_envs:
            return self._all_envs  # shared, never mutated
        if indices and (min(indices) < 0 or max(indices) >= self.num_envs):
            bad = next(i for i in indices if not 0 <= i < self.num_envs)
            raise IndexError(f"env index {bad} is out of range for a pool of {self.num_envs} envs")
        if len(set(indices)) != len(indices):
            seen: set[int] = set()
            bad = next(i for i in indices if i in seen or seen.add(i))
            raise ValueError(f"env index {bad} appears more than once")
        return indices

    def _targets(self, td: TensorDictBase | None, env_index: EnvIndex | None) -> list[int]:
        indices = self._indices(env_index)
        if indices is None and td is not None and "env_index" in td.keys():
            indices = self._indices(td.get("env_index"))
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
        for i in indices:
            if self._pending[i] is not None or i in self._ready or i in self._answers or i in self._orphans:
                raise EnvBusyError(i)
        return indices

    # -- sending ---------------------------------------------------------------------

    def _dispatch(self, command: Command) -> None:
        now = time.perf_counter()
        kind = command.kind
        for i in command.env_indices:
            self._pending[i] = kind
            self._sent_at[i] = now
        self._in_flight += len(command.env_indices)
        if kind in TRANSITIONS:
            self._outstanding[kind] += len(command.env_indices)
        self._executor.submit(command)

    def _send_actions(self, kind: CommandKind, td: TensorDictBase, env_index: EnvIndex | None) -> list[int]:
        batcher = self._batcher_or_raise()
        if not isinstance(td, TensorDictBase):
            raise TypeError(f"expected a TensorDict of actions, got {type(td).__name__}")
        indices = self._targets(td, env_index)
        batcher.check_actions(td, indices)
        batcher.write_actions(td, indices)
        stored = td.copy()  # later key changes by the caller do not reach the results
        for row, i in enumerate(indices):
            self._inputs[i] = (stored, row)
        self._dispatch(Command(kind, indices))
        return indices

    async def async_step_send(self, td: TensorDictBase, env_index: EnvIndex | None = None) -> None:
        """Dispatch one step to each env of ``td`` (its ``"env_index"``, ``env_index=``, or all).

        Returns once the actions are dispatched. Raises EnvBusyError for an env with a
        command in flight or a result not yet received, ValueError for actions that do
        not fit the env's action space; nothing is dispatched then.
        """
        self._send_actions(_STEP, td, env_index)

    async def async_step_and_maybe_reset_send(
        self, td: TensorDictBase, env_index: EnvIndex | None = None
    ) -> None:
        """Like :meth:`async_step_send`, and envs whose episode ends are reset in the same round trip."""
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
        self._send_reset(td, env_index, seed, options)

    def _send_reset(
        self,
        td: TensorDictBase | None,
        env_index: EnvIndex | None,
        seed: int | Sequence[int | None] | None,
        options: Mapping[str, Any] | None,
    ) -> list[int]:
        self._batcher_or_raise()
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
        for c in completions:
            i = c.env_index
            if self._pending[i] is None:  # an answer for a command abandoned by close
                continue
            self._pending[i] = None
            self._in_flight -= 1
            if c.kind not in TRANSITIONS:
                if c.error is not None:
                    self._errors[i] += 1
                if i in self._orphans:  # its caller was cancelled
                    self._orphans.discard(i)
                else:
                    self._answers[i] = c
                continue
            self._ready[i] = c
            if c.error is not None:
                self._errors[i] += 1
                self._states[i] = EnvState.ERROR
                continue
            if c.kind is _RESET:
                self._states[i] = EnvState.RUN
                continue
            latency = now - self._sent_at[i]
            self._steps[i] += 1
            self._latency_sum[i] += latency
            self._latency_last[i] = latency
            self._states[i] = EnvState.DONE if c.done and not c.was_reset else EnvState.RUN

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
        raise c.error.to_exception(i, c.kind.value)

    async def _recv(
        self,
        kind: CommandKind,
        min_get: int | None,
        max_get: int | None,
        env_index: EnvIndex | None,
        timeout: float | None,
    ) -> list[Completion]:
        self._check_open()
        wanted = self._indices(env_index)
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
        self._drain()
        picked = self._take(kind, wanted, max_get)
        if len(picked) < min_get:
            async with asyncio.timeout(timeout):
                while len(picked) < min_get:
                    await self._executor.wait_ready()
                    if self._closed:
                        raise PoolClosedError("the pool was closed while waiting")
                    self._drain()
                    picked = self._take(kind, wanted, max_get)
        if wanted is None:
            picked.sort(key=lambda c: c.env_index)
        for c in picked:
            del self._ready[c.env_index]
        self._outstanding[kind] -= len(picked)
        return picked

    def _pop_inputs(self, picked: list[Completion]) -> list[Inputs]:
        inputs = []
        for c in picked:
            entry = self._inputs[c.env_index]
            assert entry is not None
            inputs.append(entry)
            self._inputs[c.env_index] = None
        return inputs

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

    async def reset(
        self,
        td: TensorDictBase | None = None,
        *,
        env_index: EnvIndex | None = None,
        seed: int | Sequence[int | None] | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> TensorDictBase:
        """Reset some envs (default all) and return their first observations, in that order."""
        indices = self._send_reset(td, env_index, seed, options)
        return await self.async_reset_recv(env_index=indices)

    async def step(self, td: TensorDictBase, env_index: EnvIndex | None = None) -> TensorDictBase:
        """Step every env of ``td`` and return their results, in the order of ``td``."""
        indices = self._send_actions(_STEP, td, env_index)
        return await self.async_step_recv(env_index=indices)

    async def step_and_maybe_reset(
        self, td: TensorDictBase, env_index: EnvIndex | None = None
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """Step every env of ``td``; envs whose episode ended are reset.

        Returns:
            ``(out, next_td)``: ``out`` as :meth:`step` gives it, ``next_td`` the input of
            the next step (the next observations, or the reset ones where an episode ended).
        """
        indices = self._send_actions(_SMR, td, env_index)
        return await self.async_step_and_maybe_reset_recv(env_index=indices)

    # -- calls on the envs ---------------------------------------------------------------

    async def _ask(self, command: Command) -> list[Any]:
        self._check_open()
        self._dispatch(command)
        indices = command.env_indices
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
                raise c.error.to_exception(c.env_index, command.label())
        return [c.value for c in answers]

    async def call(
        self, name: str, *args: Any, env_index: EnvIndex | None = None, **kwargs: Any
    ) -> list[Any]:
        """Call method ``name`` on each env (default all); one return value per env."""
        self._check_open()
        indices = self._targets(None, env_index)
        return await self._ask(Command(CommandKind.CALL, indices, name=name, args=args, kwargs=kwargs))

    async def get_attr(self, name: str, *, env_index: EnvIndex | None = None) -> list[Any]:
        """Attribute ``name`` of each env (default all), looked up through gymnasium wrappers."""
        self._check_open()
        indices = self._targets(None, env_index)
        return await self._ask(Command(CommandKind.GET_ATTR, indices, name=name))

    async def set_attr(self, name: str, value: Any, *, env_index: EnvIndex | None = None) -> None:
        """Set attribute ``name`` of each env (default all)."""
        self._check_open()
        indices = self._targets(None, env_index)
        await self._ask(Command(CommandKind.SET_ATTR, indices, name=name, args=(value,)))

    async def set_seed(self, seed: int) -> int:
        """Seed every env along TorchRL's seed chain (env 0 gets ``seed``); return the next seed.

        Each env is reset with its seed (and its action space seeded) at once, as TorchRL's
        ``set_seed`` does; the next :meth:`reset` continues from there.
        """
        self._check_open()
        indices = self._targets(None, None)
        seeds, after = seed_chain(seed, self.num_envs)
        await self._ask(Command(CommandKind.SEED, indices, seeds=dict(zip(indices, seeds, strict=True))))
        self._first_seeds = [None] * self.num_envs
        for i in indices:
            self._states[i] = EnvState.INIT
        return after
