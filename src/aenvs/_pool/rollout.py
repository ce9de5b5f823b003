"""Loops over whole batches, as TorchRL's ``EnvBase`` has them: random actions and rollouts.

Functions over a pool's public methods (reset, step, step_and_maybe_reset, env_specs);
:class:`~aenvs.AsyncEnvPool` offers them as methods.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import torch
from tensordict import (
    LazyStackedTensorDict,
    TensorDictBase,
    maybe_dense_stack,  # pyright: ignore[reportUnknownVariableType]
)

from aenvs import _masks as masks
from aenvs._extras import lazy_legacy_env_kept
from aenvs._indices import read_env_index
from aenvs._layout import step_mdp
from aenvs._pool.sending import member_index
from aenvs._sampling import random_actions

__all__ = ["apply_policy", "rand_action", "rollout", "stack_steps"]

Policy = Callable[[TensorDictBase], TensorDictBase | None]


class Batched(Protocol):
    """What these functions use of a pool: its public whole-batch methods."""

    @property
    def num_envs(self) -> int: ...
    @property
    def env_specs(self) -> Sequence[Any]: ...
    @property
    def is_dense(self) -> bool: ...
    def rand_action(self, td: TensorDictBase | None = None) -> TensorDictBase: ...
    async def reset(self, td: TensorDictBase | None = None) -> TensorDictBase: ...
    async def step(self, td: TensorDictBase) -> TensorDictBase: ...
    async def step_and_maybe_reset(self, td: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]: ...


P = TypeVar("P", bound=Batched)


def apply_policy(policy: Policy, td: TensorDictBase) -> TensorDictBase:
    """Run a rollout policy: it writes its entries into ``td`` or returns them."""
    out = policy(td)
    if out is not None and out is not td:
        td.update(out)  # pyright: ignore[reportUnknownMemberType]
    return td


def rand_action(
    pool: Batched, td: TensorDictBase | None = None, *, generator: torch.Generator | None = None
) -> TensorDictBase:
    """:meth:`aenvs.AsyncEnvPool.rand_action`: random actions for ``td``'s envs (or all), written into it."""
    specs = pool.env_specs
    indices = list(range(pool.num_envs))
    env_index = None if td is None else member_index(td)
    if env_index is not None:
        indices = (
            read_env_index(env_index, pool.num_envs, "the input's 'env_index' entry")
            if env_index.numel()
            else []
        )
    batch_shape = specs[0].batch_shape if specs else ()
    if batch_shape:  # members with a batch shape of their own: one draw per sub-env
        count = math.prod(batch_shape)
        spaces = [specs[i].action_space for i in indices for _ in range(count)]
        roots = [specs[i].action_root for i in indices for _ in range(count)]
        actions = random_actions(spaces, dense=pool.is_dense, generator=generator, roots=roots)
        actions = actions.reshape(torch.Size([len(indices), *batch_shape]))  # pyright: ignore[reportUnknownMemberType]
    else:
        actions = random_actions(
            [specs[i].action_space for i in indices],
            dense=pool.is_dense,
            generator=generator,
            roots=[specs[i].action_root for i in indices],
        )
    if td is None:
        return actions
    td.update(actions)  # pyright: ignore[reportUnknownMemberType]
    return td


def stack_steps(steps: list[TensorDictBase], contiguous: bool) -> TensorDictBase:
    """Stack a rollout's steps on a time dim, last (after the members' own batch dims, as
    TorchRL's rollouts have it), dense where possible with ``contiguous``."""
    dim = steps[0].batch_dims
    with lazy_legacy_env_kept():  # the steps' infos may differ in keys
        return (
            maybe_dense_stack(steps, dim=dim)
            if contiguous
            else LazyStackedTensorDict.lazy_stack(steps, dim=dim)
        )


async def rollout(
    pool: P,
    max_steps: int,
    policy: Policy | None = None,
    callback: Callable[[P, TensorDictBase], Any] | None = None,
    *,
    auto_reset: bool = True,
    break_when_any_done: bool | None = None,
    break_when_all_done: bool | None = None,
    return_contiguous: bool = True,
    tensordict: TensorDictBase | None = None,
) -> TensorDictBase:
    """:meth:`aenvs.AsyncEnvPool.rollout`: up to ``max_steps`` steps of every env, batch ``[num_envs, T]``."""
    if break_when_any_done is None:
        break_when_any_done = not break_when_all_done
    if break_when_all_done is None:
        break_when_all_done = False
    if break_when_any_done and break_when_all_done:
        raise TypeError("break_when_any_done and break_when_all_done cannot both be True")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    act = policy or pool.rand_action
    if auto_reset:
        td = await pool.reset(tensordict)
    elif tensordict is None:
        raise RuntimeError("rollout(auto_reset=False) needs a tensordict to start from")
    else:
        done = masks.done_rows(tensordict)
        td = tensordict
        if bool(done.any()):
            td = masks.strip_masks(tensordict).copy()
            td.set(masks.RESET_KEY, done.unsqueeze(-1))
            td = await pool.reset(td)
    steps: list[TensorDictBase] = []
    if break_when_any_done or break_when_all_done:
        partial: torch.Tensor | None = None
        for t in range(max_steps):
            td = apply_policy(act, td)
            td = await pool.step(td)
            if partial is not None and not bool(partial.all()):
                steps.append(torch.where(partial, td, steps[-1]))  # pyright: ignore[reportArgumentType, reportCallIssue]
            else:
                steps.append(td)
            if callback is not None:
                callback(pool, td)
            if t == max_steps - 1:
                break
            td = step_mdp(td)
            done = masks.done_rows(td)
            if break_when_any_done:
                if bool(done.any()):
                    break
                continue
            partial = ~done if partial is None else partial & ~done
            if not bool(partial.any()):
                break
            if not bool(partial.all()):
                td.set(masks.STEP_KEY, partial)
    else:
        for t in range(max_steps):
            td = apply_policy(act, td)
            if t == max_steps - 1:
                out = await pool.step(td)
            else:
                out, td = await pool.step_and_maybe_reset(td)
            steps.append(out)
            if callback is not None:
                callback(pool, out)
    trajectory = stack_steps(steps, return_contiguous)
    with contextlib.suppress(RuntimeError, ValueError, NotImplementedError):
        trajectory.refine_names(..., "time")  # pyright: ignore[reportUnknownMemberType]
    return trajectory
