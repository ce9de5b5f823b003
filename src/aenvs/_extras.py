"""Entries beside the buffers, stacked per key across envs: infos, text, token ids,
messages, tensors whose shapes differ (anything an env gives that has no fixed-shape leaf).

Per key: dense when the envs agree (a tensor, a dense sub-TensorDict), a lazy stack at the
key when tensors differ in shape (:mod:`aenvs._ragged`), a non-tensor stack for values no
tensor holds; an env lacking the key gives None there. Nothing is dropped.

Example:
    >>> td = TensorDict({}, [2])
    >>> stack_extras(td, [{("info", "n"): 1}, {("info", "n"): 2}])
    >>> td["info", "n"].tolist()
    [1, 2]
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Generator, Mapping, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from tensordict import LazyStackedTensorDict, NonTensorData, TensorDict, TensorDictBase

from aenvs._ragged import is_ragged, stack_ragged
from aenvs._specs import Key
from aenvs._tensors import from_numpy, lazy_stack, maybe_dense_stack, non_tensor_stack, td_get, td_update

__all__ = ["lazy_legacy_env_kept", "nest", "put", "stack_extras", "stack_values", "to_td_value"]


def to_td_value(value: Any) -> Any:
    """Numbers and numeric arrays become tensors, mappings nested dicts, anything else non-tensor data."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, bool | int | float | np.number | np.bool_):
        return torch.tensor(value)
    if isinstance(value, np.ndarray):
        array = cast("npt.NDArray[Any]", value)
        return from_numpy(np.array(array)) if array.dtype.kind in "biuf" else NonTensorData(array)
    if isinstance(value, Mapping):
        return {str(k): to_td_value(v) for k, v in cast("Mapping[Any, Any]", value).items()}
    return NonTensorData(value)


def put(tree: dict[str, Any], key: Key, value: Any) -> None:
    """``tree[key[0]]...[key[-1]] = value``, making the inner dicts on the way."""
    for part in key[:-1]:
        tree = tree.setdefault(part, {})
    tree[key[-1]] = value


def nest(extras: Mapping[Key, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in extras.items():
        put(nested, key, value)
    return nested


_MISSING = object()
_TENSOR_LIKE = (torch.Tensor, bool, int, float, np.number, np.bool_, np.ndarray)


@contextlib.contextmanager
def lazy_legacy_env_kept() -> Generator[None, None, None]:
    """Around a stack of TensorDicts that may differ in keys: tensordict 0.14's leaves
    LAZY_LEGACY_OP="None" in os.environ, which every later subprocess importing tensordict
    fails to parse (fixed in 0.15; TorchRL 0.14 pins tensordict 0.14). Keep it as it was."""
    before = os.environ.get("LAZY_LEGACY_OP")
    try:
        yield
    finally:
        if os.environ.get("LAZY_LEGACY_OP") != before:
            if before is None:
                os.environ.pop("LAZY_LEGACY_OP", None)
            else:
                os.environ["LAZY_LEGACY_OP"] = before


def stack_values(values: Sequence[Any]) -> Any:
    """Stack one entry across envs (``_MISSING`` where an env lacks it), losing nothing."""
    if all(isinstance(v, Mapping) or v is _MISSING for v in values):
        tds = [TensorDict(to_td_value(v) if v is not _MISSING else {}, batch_size=[]) for v in values]
        try:
            stacked = maybe_dense_stack(tds)
        except (RuntimeError, ValueError, TypeError):
            stacked = lazy_stack(tds)
        keys = set(values[0]) if values[0] is not _MISSING else None
        if isinstance(stacked, LazyStackedTensorDict) and all(
            v is not _MISSING and set(v) == keys for v in values
        ):
            # same keys, some leaf shapes differ (a varying-length info entry): dense but for those
            entries = {str(k): stack_values([v[k] for v in values]) for k in values[0]}
            return TensorDict(entries, batch_size=[len(values)])
        return stacked
    # a value no tensor can hold (text, a message...) makes this a non-tensor stack: convert
    # nothing first (each conversion would build a NonTensorData the stack builds again)
    numeric = all(isinstance(v, _TENSOR_LIKE) for v in values)
    converted = [to_td_value(v) for v in values] if numeric else []
    if numeric and all(isinstance(v, torch.Tensor) for v in converted):
        first = converted[0]
        if all(v.shape == first.shape and v.dtype == first.dtype for v in converted):
            return torch.stack(converted)
        if is_ragged(converted):  # one dtype and ndim, shapes differ: token ids, point clouds...
            return stack_ragged(converted)
    return non_tensor_stack([None if v is _MISSING else v for v in values])


def stack_extras(td: TensorDictBase, extras: Sequence[Mapping[Key, Any] | None]) -> None:
    """Set every extra entry of a batch into ``td`` (batch [len(extras)]), stacked per key."""
    first = extras[0]
    if first and all(len(key) == 1 for key in first):
        keys = first.keys()
        same = [e for e in extras if e is not None and e.keys() == keys]
        if len(same) == len(extras):
            # every env gave the same root entries (a text observation...): one column per
            # key, without a nested dict per env
            with lazy_legacy_env_kept():
                for key in sorted(keys):
                    td.set(key[0], stack_values([e[key] for e in same]))
            return
    nested = [nest(e) if e else {} for e in extras]
    with lazy_legacy_env_kept():
        for key in sorted({k for n in nested for k in n}):
            value = stack_values([n.get(key, _MISSING) for n in nested])
            held = td_get(td, key)
            if isinstance(held, TensorDictBase) and isinstance(value, TensorDictBase):
                td_update(held, value)  # a sub-dict the buffers filled too (fixed parts beside these)
            else:
                td.set(key, value)
