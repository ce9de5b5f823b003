"""Calling a collector's policy: a plain callable or a coroutine function, its answer normalised.

What the policy may answer, and the errors it gets otherwise: each says what it returned,
what was expected, and for which envs.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from tensordict import TensorDictBase

from aenvs._collect.columns import Columns
from aenvs._tensors import from_numpy, non_tensor_rows, non_tensor_stack, td_get, td_keys

__all__ = ["Policy", "actions_column", "answer_columns", "call_policy", "describe"]

PolicyAnswer = TensorDictBase | Mapping[str, Any] | Sequence[Any] | torch.Tensor | None
Policy = Callable[[TensorDictBase], PolicyAnswer | Awaitable[PolicyAnswer]]
"""Called with a batch of envs ready to act (their observations, ``"env_index"`` and
``"episode"``); writes ``"action"`` into it (returning None or the batch), returns a
TensorDict (or a dict) holding ``"action"``, or returns the actions, one per row (a list:
text, token lists, numbers; or a tensor). May be an ``async def`` (an inference-server client)."""

_EXPECTED = (
    "the actions one per env (a list or a tensor of {k} rows), a TensorDict or dict of entries of "
    "{k} rows holding 'action', or None after writing td['action']"
)
_GIVEN = ("env_index", "episode")  # entries the collector reads back: the policy must leave them


async def call_policy(policy: Policy, td: TensorDictBase, envs: Sequence[int]) -> tuple[TensorDictBase, Any]:
    """Call ``policy`` on ``td`` (the batch of ``envs``): the TensorDict holding what it wrote,
    and the actions it returned (one per row: a list, or a tensor) or None if it wrote them
    into a TensorDict (or returned entries in a dict).

    A plain callable runs under ``torch.no_grad()`` (a collector gathers data; nothing
    differentiates through it); an awaitable answer is awaited.

    Example:
        >>> import asyncio
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"observation": torch.zeros(2, 3), "env_index": torch.tensor([4, 7])}, [2])
        >>> asyncio.run(call_policy(lambda td: ["look", "go"], td, [4, 7]))[1]
        ['look', 'go']
        >>> asyncio.run(call_policy(lambda td: 1, td, [4, 7]))
        Traceback (most recent call last):
        ...
        TypeError: the policy returned int 1 for envs [4, 7]; expected the actions one per env (a list or a tensor of 2 rows), a TensorDict or dict of entries of 2 rows holding 'action', or None after writing td['action']
    """
    given = {key: td_get(td, key) for key in _GIVEN}
    with torch.no_grad():
        answer: Any = policy(td)
    if inspect.isawaitable(answer):
        answer = await cast(Awaitable[PolicyAnswer], answer)
    k = td.batch_size[0]
    returned: Any = None
    if isinstance(answer, TensorDictBase):
        if answer.batch_size[:1] != td.batch_size[:1]:
            raise ValueError(
                f"the policy returned a TensorDict of batch {list(answer.batch_size)} for envs {list(envs)}; "
                f"expected batch [{k}], a row per env"
            )
        if answer is not td:
            td.update(answer)  # pyright: ignore[reportUnknownMemberType]
    elif isinstance(answer, Mapping):
        _set_entries(td, cast("Mapping[Any, Any]", answer), (), envs)
    elif answer is not None:
        if isinstance(answer, str | bytes) or not isinstance(answer, Sequence | torch.Tensor | np.ndarray):
            raise TypeError(
                f"the policy returned {describe(answer)} for envs {list(envs)}; expected "
                + _EXPECTED.format(k=k)
            )
        returned = actions_column(answer, k, envs)
    _check_given(td, given, envs)
    return td, returned


def answer_columns(
    out: TensorDictBase, returned: Any, action_keys: Sequence[tuple[str, ...]], envs: Sequence[int]
) -> tuple[Columns, dict[tuple[str, ...], Any]]:
    """The policy's answer as :func:`call_policy` gives it, read: its batch as columns (what
    the transitions record, with the actions) and the actions to send by key.

    Example:
        >>> from tensordict import TensorDict
        >>> out = TensorDict({"env_index": torch.tensor([0, 1])}, [2])
        >>> columns, actions = answer_columns(out, ["go", "look"], [("action",)], [0, 1])
        >>> columns.leaves[("action",)], actions
        (['go', 'look'], {('action',): ['go', 'look']})
    """
    columns = Columns(out)
    actions: dict[tuple[str, ...], Any] = {}
    if returned is not None:  # the actions as the policy gave them: no object per text action
        actions[("action",)] = returned
        if columns.leaves is None:
            action = returned if isinstance(returned, torch.Tensor) else non_tensor_stack(returned)
            out.set("action", action)  # pyright: ignore[reportUnknownMemberType]
            columns = Columns(out)
        else:
            columns.leaves[("action",)] = returned.numpy() if isinstance(returned, torch.Tensor) else returned
        return columns, actions
    for key in action_keys:
        value = td_get(out, key)
        if value is None:
            raise KeyError(
                f"the policy's answer has no {'.'.join(key)!r} entry for envs {list(envs)}: write "
                f"td[{key[0]!r}] (one per env), or return the actions"
            )
        actions[key] = value if isinstance(value, torch.Tensor) else non_tensor_rows(value, len(envs))
    return columns, actions


def actions_column(
    actions: Any, size: int, envs: Sequence[int] | None = None, key: str = ""
) -> torch.Tensor | list[Any]:
    """The actions a policy returned, ``size`` rows (for ``envs``, as its entry ``key``: both
    named in errors): a tensor for tensors and numbers, else a list of the values (text,
    token lists, dicts).

    Example:
        >>> actions_column([1, 0], 2).tolist(), actions_column(["go", "look"], 2)
        ([1, 0], ['go', 'look'])
        >>> actions_column([1], 2, envs=[3, 5])
        Traceback (most recent call last):
        ...
        ValueError: the policy returned a list of 1 value: [1] for envs [3, 5]; expected one action per env (2 rows)
    """
    if isinstance(actions, torch.Tensor):
        values: torch.Tensor = actions
    elif isinstance(actions, np.ndarray):
        values = from_numpy(np.ascontiguousarray(cast("np.ndarray[Any, Any]", actions)))
    else:
        rows = list(cast(Sequence[Any], actions))
        if len(rows) != size:
            raise ValueError(_rows_error(actions, size, envs, key))
        if rows and all(isinstance(v, torch.Tensor | np.ndarray) for v in rows):
            values = torch.stack([torch.as_tensor(v) for v in rows])
        elif rows and all(isinstance(v, int | float | bool | np.number) for v in rows):
            values = torch.as_tensor(rows)
        else:
            return rows
    if values.shape[:1] != (size,):
        raise ValueError(_rows_error(actions, size, envs, key))
    return values


def describe(value: Any) -> str:
    """A short description of what a policy returned, for errors.

    Example:
        >>> describe(["go", "go", None]), describe(torch.zeros(3, 2)), describe({"action": 1})
        ("a list of 3 values: ['go', 'go', None]", 'a tensor of shape [3, 2] and dtype torch.float32', "a dict with keys ['action']")
    """
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {list(value.shape)} and dtype {value.dtype}"
    if isinstance(value, np.ndarray):
        array = cast("np.ndarray[Any, Any]", value)
        return f"an array of shape {list(array.shape)} and dtype {array.dtype}"
    if isinstance(value, TensorDictBase):
        return f"a TensorDict of batch {list(value.batch_size)} with keys {sorted(map(str, td_keys(value)))}"
    if isinstance(value, Mapping):
        return f"a dict with keys {list(cast('Mapping[Any, Any]', value))}"
    if isinstance(value, list | tuple):
        rows: Sequence[Any] = cast("Sequence[Any]", value)
        shown = ", ".join(_short(v) for v in rows[:3]) + (", ..." if len(rows) > 3 else "")
        kind = "list" if isinstance(rows, list) else "tuple"
        return f"a {kind} of {len(rows)} value{'s' if len(rows) != 1 else ''}: [{shown}]"
    return f"{type(value).__name__} {_short(value)}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _rows_error(actions: Any, size: int, envs: Sequence[int] | None, key: str = "") -> str:
    where = f" as {key!r}" if key else ""
    for_envs = f" for envs {list(envs)}" if envs is not None else ""
    return (
        f"the policy returned {describe(actions)}{where}{for_envs}; expected one "
        f"{'row' if key else 'action'} per env ({size} rows)"
    )


def _set_entries(
    td: TensorDictBase, entries: Mapping[Any, Any], prefix: tuple[str, ...], envs: Sequence[int]
) -> None:
    """Write a dict the policy returned into ``td``, entry by entry (nested dicts as nested keys)."""
    k = td.batch_size[0]
    for name, value in entries.items():
        key = (*prefix, str(name))
        if isinstance(value, Mapping):
            _set_entries(td, cast("Mapping[Any, Any]", value), key, envs)
            continue
        if isinstance(value, str | bytes) or not isinstance(value, Sequence | torch.Tensor | np.ndarray):
            raise TypeError(
                f"the policy returned {describe(value)} as {'.'.join(key)!r} for envs {list(envs)}; "
                f"expected one value per env ({k} rows: a list or a tensor)"
            )
        column = actions_column(value, k, envs, ".".join(key))
        td.set(key, column if isinstance(column, torch.Tensor) else non_tensor_stack(column))  # pyright: ignore[reportUnknownMemberType]


def _check_given(td: TensorDictBase, given: Mapping[str, Any], envs: Sequence[int]) -> None:
    """Raise ValueError where the policy changed an entry the collector reads back."""
    for key, before in given.items():
        if not isinstance(before, torch.Tensor):
            continue
        now = td_get(td, key)
        if now is before:  # the same tensor: unchanged, unless written in place
            if key != "env_index" or now.tolist() == list(envs):
                continue
        elif isinstance(now, torch.Tensor) and now.shape == before.shape and torch.equal(now, before):
            continue
        shown = str(now.tolist()) if isinstance(now, torch.Tensor) else describe(now)  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
        raise ValueError(
            f"the policy changed {key!r} for envs {list(envs)} (to {shown}); the collector sends row "
            f"j's action to the env it batched in row j and records the episode it belongs to, so "
            f"leave {key!r} as given (return the actions in the rows' order)"
        )
