"""The pool's whole-batch calls (``reset``, ``step``, ``step_and_maybe_reset``), with
TorchRL's partial steps and resets: inputs with ``"_step"`` / ``"_reset"`` masks.

Only the envs (or groups) marked are stepped or reset; the others keep their input
values. The rules themselves live in :mod:`aenvs._masks`; this module runs them on a pool.
A whole-batch call that is cancelled (Ctrl-C in the sync shim, a task cancel) abandons
its command: its results are dropped when they arrive, so the next whole-batch call finds
the envs free instead of busy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol, cast

import numpy as np
import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

from aenvs import _masks as masks
from aenvs._commands import CommandKind
from aenvs._layout import TIMED_OUT
from aenvs._pool.parts import PoolParts
from aenvs._pool.sending import EnvIndex, Seed, check_options
from aenvs._seeding import seed_chain
from aenvs._specs import Leaf
from aenvs._tensors import root_entries, td_get, td_keys

__all__ = ["WholeBatchCalls", "has_step_masks"]

_STEP, _RESET, _SMR = CommandKind.STEP, CommandKind.RESET, CommandKind.STEP_AND_RESET


class Batched(Protocol):
    """What the whole-batch calls use of the pool: its public methods."""

    @property
    def is_dense(self) -> bool: ...
    @property
    def batch_size(self) -> torch.Size: ...
    async def async_reset_recv(self, *, env_index: EnvIndex | None = None) -> TensorDictBase: ...
    async def async_step_recv(self, *, env_index: EnvIndex | None = None) -> TensorDictBase: ...
    async def async_step_and_maybe_reset_recv(
        self, *, env_index: EnvIndex | None = None
    ) -> tuple[TensorDictBase, TensorDictBase]: ...
    async def reset(self, td: TensorDictBase | None = None) -> TensorDictBase: ...
    async def step(self, td: TensorDictBase, env_index: EnvIndex | None = None) -> TensorDictBase: ...
    async def step_and_maybe_reset(
        self, td: TensorDictBase, env_index: EnvIndex | None = None
    ) -> tuple[TensorDictBase, TensorDictBase]: ...


def has_step_masks(td: TensorDictBase) -> bool:
    """Whether a step's input has a ``"_step"`` or ``"_reset"`` entry (False for a non-TensorDict,
    which the step then refuses).

    Example:
        >>> from tensordict import TensorDict
        >>> has_step_masks(TensorDict({"_step": torch.ones(2, dtype=torch.bool)}, [2]))
        True
    """
    if not isinstance(cast(object, td), TensorDictBase):
        return False
    keys = root_entries(td) if type(td) is TensorDict else list(td_keys(td))
    return masks.STEP_KEY in keys or masks.RESET_KEY in keys


class WholeBatchCalls:
    """The pool's ``reset``, ``step`` and ``step_and_maybe_reset``: send, then receive every result.

    Args:
        pool: the pool (its public methods).
        parts: the pool's parts (targets checked, commands dispatched, abandoned ones dropped).
    """

    def __init__(self, pool: Batched, parts: PoolParts) -> None:
        self._pool = pool
        self._parts = parts
        self._sender = parts.sender

    async def reset(
        self,
        td: TensorDictBase | None,
        env_index: EnvIndex | None,
        seed: Seed,
        options: Mapping[str, Any] | None,
    ) -> TensorDictBase:
        """:meth:`aenvs.AsyncEnvPool.reset`."""
        check_options(options)
        await self._parts.settle(td, env_index, whole=True)
        if td is not None and masks.has_reset_mask(td):
            return await self._masked_reset(td, env_index, seed, options)
        indices = self._sender.send_reset(td, env_index, seed, options)
        return await self._receive_all(_RESET, indices)

    async def step(self, td: TensorDictBase, env_index: EnvIndex | None) -> TensorDictBase:
        """:meth:`aenvs.AsyncEnvPool.step`."""
        await self._parts.settle(td, env_index, whole=True)
        if has_step_masks(td):
            return (await self._masked_step(td, env_index, and_reset=False))[0]
        sent = self._parts.send_whole_now(_STEP, td) if env_index is None else None
        if isinstance(sent, tuple):  # run already, every env answered plainly
            return self._parts.batcher().step_whole(td)
        indices = self._sender.send_actions(_STEP, td, env_index) if sent is None else sent
        return await self._receive_all(_STEP, indices)

    async def step_and_maybe_reset(
        self, td: TensorDictBase, env_index: EnvIndex | None
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """:meth:`aenvs.AsyncEnvPool.step_and_maybe_reset`."""
        await self._parts.settle(td, env_index, whole=True)
        if has_step_masks(td):
            out, nxt = await self._masked_step(td, env_index, and_reset=True)
            assert nxt is not None
            return out, nxt
        sent = self._parts.send_whole_now(_SMR, td) if env_index is None else None
        if isinstance(sent, tuple):  # run already, every env answered plainly
            return self._parts.batcher().step_and_reset_whole(td)
        indices = self._sender.send_actions(_SMR, td, env_index) if sent is None else sent
        try:
            return await self._pool.async_step_and_maybe_reset_recv(env_index=indices)
        except BaseException as exc:
            self._parts.abandoned.give_up(exc, _SMR, indices)
            raise

    async def _receive_all(self, kind: CommandKind, indices: list[int]) -> TensorDictBase:
        """Receive the results of a reset or step to ``indices``, or abandon them."""
        try:
            if kind is _RESET:
                return await self._pool.async_reset_recv(env_index=indices)
            return await self._pool.async_step_recv(env_index=indices)
        except BaseException as exc:
            self._parts.abandoned.give_up(exc, kind, indices)
            raise

    async def _masked_reset(
        self,
        td: TensorDictBase,
        env_index: EnvIndex | None,
        seed: Seed,
        options: Mapping[str, Any] | None,
    ) -> TensorDictBase:
        """:meth:`reset` of an input with ``"_reset"`` masks."""
        sender = self._sender
        done_keys = {leaf.key for s in sender.specs for leaf in s.reset_leaves if leaf.key[-1] == "done"}
        plan = masks.plan_reset(td, done_keys)
        previous = masks.strip_masks(td)
        indices = sender.targets(previous, env_index)
        rows_env_index = self._env_index(indices)
        targets = [indices[r] for r in plan.rows]
        sub_envs = None if plan.groups is not None else self._sub_env_options(td, plan.rows)
        if not targets:
            out = previous.copy()
            out.set("env_index", rows_env_index)
            return out
        if plan.groups is None and sub_envs is None:
            sender.send_reset(None, targets, seed, options)
        else:  # one command per env: each gets its groups' (or sub-envs') masks in its options
            sender.targets(None, targets)  # all free, before dispatching any
            if seed is None:
                seeds: list[Seed] = [None] * len(targets)
            elif isinstance(seed, int):
                seeds = [[s] for s in seed_chain(seed, len(targets))[0]]
            else:
                seeds = [[s] for s in seed]
                if len(seeds) != len(targets):
                    raise ValueError(f"{len(seeds)} seeds for {len(targets)} envs")
            per_env = plan.options if sub_envs is None else sub_envs
            for i, env_seed, env_options in zip(targets, seeds, per_env, strict=True):
                sender.send_reset(None, [i], env_seed, {**(options or {}), **(env_options or {})})
        reset = await self._receive_all(_RESET, targets)
        return masks.merge_reset(previous, reset, plan, rows_env_index)

    async def _masked_step(
        self, td: TensorDictBase, env_index: EnvIndex | None, *, and_reset: bool
    ) -> tuple[TensorDictBase, TensorDictBase | None]:
        """:meth:`step` (or :meth:`step_and_maybe_reset`) of an input with a ``"_step"`` mask."""
        pool, sender = self._pool, self._sender
        dense = pool.is_dense  # raises if the pool is closed
        mask = masks.step_mask(td)
        previous = masks.strip_masks(td)
        if mask is None or bool(mask.all()):
            if and_reset:
                return await pool.step_and_maybe_reset(previous, env_index)
            return await pool.step(previous, env_index), None
        indices = sender.targets(previous, env_index)
        rows: list[int] = np.flatnonzero(mask.numpy(force=True)).tolist()
        targets = [indices[r] for r in rows]
        kind = _SMR if and_reset else _STEP
        stepped = nxt = None
        if rows:
            sub = previous[mask] if dense else LazyStackedTensorDict.lazy_stack([previous[r] for r in rows])
            sender.send_actions(kind, sub, targets)
            try:
                if and_reset:
                    stepped, nxt = await pool.async_step_and_maybe_reset_recv(env_index=targets)
                else:
                    stepped = await pool.async_step_recv(env_index=targets)
            except BaseException as exc:
                self._parts.abandoned.give_up(exc, kind, targets)
                raise
        rows_env_index = self._env_index(indices)
        template = self._zeros(indices, "step", dense)
        out = masks.merge_step(
            previous, stepped if stepped is not None else template[:0], rows, template, rows_env_index
        )
        if not and_reset:
            return out, None
        reset_template = self._zeros(indices, "reset", dense)
        next_td = masks.fill_rows(
            previous, nxt if nxt is not None else reset_template[:0], rows, reset_template
        )
        next_td.set("env_index", rows_env_index)
        carried_done = masks.done_rows(previous) & ~mask
        if bool(carried_done.any()):  # envs not stepped whose input is done: reset them, as TorchRL does
            reset = carried_done.unsqueeze(-1)
            shape = pool.batch_size[1:]
            done = td_get(previous, "done") if shape else None
            if isinstance(done, torch.Tensor):  # members with sub-envs: those done, of those not stepped
                reset = done.reshape(-1, *shape, 1) & ~mask.reshape(-1, *(1 for _ in shape), 1)
            next_td.set(masks.RESET_KEY, reset)
            next_td = await pool.reset(next_td)
        return out, next_td

    def _env_index(self, indices: list[int]) -> torch.Tensor:
        """The "env_index" entry of a batch of ``indices``, expanded over the members' own batch
        shape if they have one (as the pool's batches carry it)."""
        env_index = torch.tensor(indices, dtype=torch.long)
        shape = self._pool.batch_size[1:]
        if shape:
            env_index = env_index.reshape(-1, *(1 for _ in shape)).expand(-1, *shape).clone()
        return env_index

    def _sub_env_options(self, td: TensorDictBase, rows: list[int]) -> list[dict[str, Any] | None] | None:
        """For members with a batch shape of their own and a root ``"_reset"`` per sub-env
        (``[B, *batch_shape, 1]``): per row of ``rows``, the reset options naming its sub-envs
        to reset (TorchRL envs reset those only). None when there is nothing per sub-env."""
        shape = self._pool.batch_size[1:]
        mask = td_get(td, masks.RESET_KEY) if shape else None
        if not isinstance(mask, torch.Tensor) or mask.dim() < 1 + len(shape):
            return None
        if tuple(mask.shape[1 : 1 + len(shape)]) != tuple(shape):
            return None
        per_sub_env = mask.reshape(mask.shape[0], *shape, -1).any(-1, keepdim=True).numpy(force=True)
        return [{masks.RESET_KEY: per_sub_env[r].copy()} for r in rows]

    def _zeros(self, indices: list[int], which: Literal["step", "reset"], dense: bool) -> TensorDictBase:
        """Zeros laid out as the step results (or reset results) of ``indices``, with the
        ``"timed_out"`` flag of step results when timeouts truncate."""
        specs = self._sender.specs
        if which == "reset":
            return masks.zeros([specs[i].reset_leaves for i in indices], dense=dense)
        if not self._parts.options.truncate:
            return masks.zeros([specs[i].step_leaves for i in indices], dense=dense)
        # step results of a pool whose timeouts truncate carry a "timed_out" flag: the rows
        # not stepped too, so that every row (and a batch of none stepped) has it
        flag = [Leaf((TIMED_OUT,), (*specs[i].batch_shape, 1), np.dtype(bool)) for i in indices]
        return masks.zeros(
            [(*specs[i].step_leaves, f) for i, f in zip(indices, flag, strict=True)], dense=dense
        )
