"""TorchRL's partial steps and resets: inputs with ``"_step"`` / ``"_reset"`` masks.

Only the envs (or groups) marked are stepped or reset; the others keep their input
values. The rules themselves live in :mod:`aenvs._masks`; this module runs them on a pool.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import torch
from tensordict import TensorDictBase, lazy_stack

from aenvs import _masks as masks
from aenvs._commands import CommandKind
from aenvs._seeding import seed_chain
from aenvs._specs import EnvSpec

EnvIndex = int | Sequence[int] | torch.Tensor
Seed = int | Sequence[int | None] | None


class _Pool(Protocol):
    """What the masked calls use of the pool (its own modules may use its privates)."""

    _specs: list[EnvSpec]

    @property
    def is_dense(self) -> bool: ...
    def _batcher_or_raise(self) -> Any: ...
    def _targets(self, td: TensorDictBase | None, env_index: EnvIndex | None) -> list[int]: ...
    def _send_actions(
        self, kind: CommandKind, td: TensorDictBase, env_index: EnvIndex | None
    ) -> list[int]: ...
    def _send_reset(
        self,
        td: TensorDictBase | None,
        env_index: EnvIndex | None,
        seed: Seed,
        options: Mapping[str, Any] | None,
    ) -> list[int]: ...
    def _give_up(self, exc: BaseException, kind: CommandKind, indices: Sequence[int]) -> None: ...
    async def _recv_or_abandon(self, kind: CommandKind, indices: list[int]) -> TensorDictBase: ...
    async def async_step_recv(self, *, env_index: EnvIndex | None = None) -> TensorDictBase: ...
    async def async_step_and_maybe_reset_recv(
        self, *, env_index: EnvIndex | None = None
    ) -> tuple[TensorDictBase, TensorDictBase]: ...
    async def reset(self, td: TensorDictBase | None = None) -> TensorDictBase: ...
    async def step(self, td: TensorDictBase, env_index: EnvIndex | None = None) -> TensorDictBase: ...
    async def step_and_maybe_reset(
        self, td: TensorDictBase, env_index: EnvIndex | None = None
    ) -> tuple[TensorDictBase, TensorDictBase]: ...


__all__ = ["masked_reset", "masked_step"]

_STEP, _RESET, _SMR = CommandKind.STEP, CommandKind.RESET, CommandKind.STEP_AND_RESET


async def masked_reset(
    pool: _Pool,
    td: TensorDictBase,
    env_index: EnvIndex | None,
    seed: int | Sequence[int | None] | None,
    options: Mapping[str, Any] | None,
) -> TensorDictBase:
    done_keys = {leaf.key for s in pool._specs for leaf in s.reset_leaves if leaf.key[-1] == "done"}
    plan = masks.plan_reset(td, done_keys)
    previous = masks.strip_masks(td)
    indices = pool._targets(previous, env_index)
    rows_env_index = torch.tensor(indices, dtype=torch.long)
    targets = [indices[r] for r in plan.rows]
    if not targets:
        out = previous.copy()
        out.set("env_index", rows_env_index)
        return out
    if plan.groups is None:
        pool._send_reset(None, targets, seed, options)
    else:  # one command per env: each gets its groups' masks in its options
        pool._targets(None, targets)  # all free, before dispatching any
        if seed is None:
            seeds: list[Any] = [None] * len(targets)
        elif isinstance(seed, int):
            seeds = [[s] for s in seed_chain(seed, len(targets))[0]]
        else:
            seeds = [[s] for s in seed]
            if len(seeds) != len(targets):
                raise ValueError(f"{len(seeds)} seeds for {len(targets)} envs")
        for i, env_seed, env_options in zip(targets, seeds, plan.options, strict=True):
            pool._send_reset(None, [i], env_seed, {**(options or {}), **(env_options or {})})
    reset = await pool._recv_or_abandon(_RESET, targets)
    return masks.merge_reset(previous, reset, plan, rows_env_index)


async def masked_step(
    pool: _Pool, td: TensorDictBase, env_index: EnvIndex | None, *, and_reset: bool
) -> tuple[TensorDictBase, TensorDictBase | None]:
    """:meth:`step` (or :meth:`step_and_maybe_reset`) of an input with a ``"_step"`` mask."""
    pool._batcher_or_raise()
    mask = masks.step_mask(td)
    previous = masks.strip_masks(td)
    if mask is None or bool(mask.all()):
        if and_reset:
            return await pool.step_and_maybe_reset(previous, env_index)
        return await pool.step(previous, env_index), None
    indices = pool._targets(previous, env_index)
    rows = mask.nonzero().flatten().tolist()
    targets = [indices[r] for r in rows]
    kind = _SMR if and_reset else _STEP
    stepped = nxt = None
    if rows:
        sub = previous[mask] if pool.is_dense else lazy_stack([previous[r] for r in rows])
        pool._send_actions(kind, sub, targets)
        try:
            if and_reset:
                stepped, nxt = await pool.async_step_and_maybe_reset_recv(env_index=targets)
            else:
                stepped = await pool.async_step_recv(env_index=targets)
        except BaseException as exc:
            pool._give_up(exc, kind, targets)
            raise
    rows_env_index = torch.tensor(indices, dtype=torch.long)
    template = _zeros(pool, indices, "step")
    out = masks.merge_step(
        previous, stepped if stepped is not None else template[:0], rows, template, rows_env_index
    )
    if not and_reset:
        return out, None
    reset_template = _zeros(pool, indices, "reset")
    next_td = masks.fill_rows(previous, nxt if nxt is not None else reset_template[:0], rows, reset_template)
    next_td.set("env_index", rows_env_index)
    carried_done = masks.done_rows(previous) & ~mask
    if bool(carried_done.any()):  # envs not stepped whose input is done: reset them, as TorchRL does
        next_td.set(masks.RESET_KEY, carried_done.unsqueeze(-1))
        next_td = await pool.reset(next_td)
    return out, next_td


def _zeros(pool: _Pool, indices: list[int], which: Literal["step", "reset"]) -> TensorDictBase:
    """Zeros laid out as the step results (or reset results) of ``indices``."""
    layouts = [
        pool._specs[i].step_leaves if which == "step" else pool._specs[i].reset_leaves for i in indices
    ]
    return masks.zeros(layouts, dense=pool.is_dense)
