"""Calling a collector's policy: a plain callable or a coroutine function, its answer normalised."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import numpy as np
import torch
from tensordict import TensorDictBase

from aenvs._tensors import from_numpy

__all__ = ["Policy", "actions_column", "call_policy"]

PolicyAnswer = TensorDictBase | Sequence[Any] | torch.Tensor | None
Policy = Callable[[TensorDictBase], PolicyAnswer | Awaitable[PolicyAnswer]]
"""Called with a batch of envs ready to act (their observations, ``"env_index"`` and
``"episode"``); writes ``"action"`` into it (returning None or the batch), returns a
TensorDict holding ``"action"``, or returns the actions, one per row (a list: text, token
lists, numbers; or a tensor). May be an ``async def`` (an inference-server client)."""

_PLAIN = (str, bytes, dict, list, tuple)


async def call_policy(policy: Policy, td: TensorDictBase) -> tuple[TensorDictBase, Any]:
    """Call ``policy`` on ``td``: the TensorDict holding what it wrote, and the actions it
    returned (one per row: a list, or a tensor) or None if it wrote them into a TensorDict.

    A plain callable runs under ``torch.no_grad()`` (a collector gathers data; nothing
    differentiates through it); an awaitable answer is awaited.

    Example:
        >>> import asyncio
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"observation": torch.zeros(2, 3)}, [2])
        >>> asyncio.run(call_policy(lambda td: ["look", "go"], td))[1]
        ['look', 'go']
    """
    with torch.no_grad():
        answer: Any = policy(td)
    if inspect.isawaitable(answer):
        answer = await cast(Awaitable[PolicyAnswer], answer)
    if answer is None:
        return td, None
    if isinstance(answer, TensorDictBase):
        if answer.batch_size[:1] != td.batch_size[:1]:
            raise ValueError(
                f"the policy returned a TensorDict of batch {list(answer.batch_size)} for a batch of "
                f"{td.batch_size[0]} envs"
            )
        if answer is not td:
            td.update(answer)  # pyright: ignore[reportUnknownMemberType]
        return td, None
    return td, actions_column(answer, td.batch_size[0])


def actions_column(actions: Any, size: int) -> torch.Tensor | list[Any]:
    """The actions a policy returned, ``size`` rows: a tensor for tensors and numbers, else
    a list of the values (text, token lists, dicts).

    Example:
        >>> actions_column([1, 0], 2).tolist(), actions_column(["go", "look"], 2)
        ([1, 0], ['go', 'look'])
    """
    if isinstance(actions, torch.Tensor):
        values: torch.Tensor = actions
    elif isinstance(actions, np.ndarray):
        values = from_numpy(np.ascontiguousarray(cast("np.ndarray[Any, Any]", actions)))
    else:
        rows = list(cast(Sequence[Any], actions))
        if len(rows) != size:
            raise ValueError(f"the policy returned {len(rows)} actions for a batch of {size} envs")
        if rows and all(isinstance(v, torch.Tensor | np.ndarray) for v in rows):
            values = torch.stack([torch.as_tensor(v) for v in rows])
        elif rows and all(isinstance(v, int | float | bool | np.number) for v in rows):
            values = torch.as_tensor(rows)
        else:
            return rows
    if values.shape[:1] != (size,):
        raise ValueError(
            f"the policy returned actions of shape {list(values.shape)} for a batch of {size} envs"
        )
    return values
