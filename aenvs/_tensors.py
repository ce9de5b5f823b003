"""Small numpy <-> torch helpers, and typed doors to the tensordict and torch calls that
pyright cannot see the types of (their libraries leave a parameter unannotated).

The few reads of tensordict's private API that the hot path relies on (a TensorDict's
own entry dict, its unchecked constructor) live here too, so that they sit in one place.

Example:
    >>> from_numpy(np.arange(3)).tolist()
    [0, 1, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import tensordict
import torch
from tensordict import LazyStackedTensorDict, NonTensorData, NonTensorStack, TensorDict, TensorDictBase
from tensordict.utils import NestedKey

__all__ = [
    "flat_entries",
    "from_numpy",
    "lazy_stack",
    "maybe_dense_stack",
    "non_tensor_stack",
    "root_entries",
    "td_clone",
    "td_get",
    "td_items",
    "td_keys",
    "td_unchecked",
    "td_update",
    "tensor_tolist",
    "torch_dtype",
]

from_numpy = cast("Callable[[npt.NDArray[Any]], torch.Tensor]", torch.from_numpy)  # pyright: ignore[reportUnknownMemberType]
"""``torch.from_numpy``, typed: a tensor sharing the array's memory (the function itself,
not a wrapper: it is called once per leaf on the hot path)."""


def torch_dtype(dtype: Any) -> torch.dtype:
    """The torch dtype of a numpy dtype (or anything ``np.dtype`` reads).

    Example:
        >>> torch_dtype(np.float32)
        torch.float32
    """
    return from_numpy(np.empty(0, np.dtype(dtype))).dtype


def tensor_tolist(tensor: torch.Tensor) -> list[Any]:
    """``tensor.tolist()``, typed (torch annotates it as a bare ``list``).

    Example:
        >>> tensor_tolist(torch.tensor([1, 2]))
        [1, 2]
    """
    return tensor.tolist()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


def td_keys(
    td: TensorDictBase,
    *,
    nested: bool = False,
    leaves: bool = False,
    is_leaf: Callable[[type], bool] | None = None,
) -> Iterator[NestedKey]:
    """The keys of ``td`` (``td.keys(nested, leaves, is_leaf)``), typed.

    Example:
        >>> from tensordict import TensorDict
        >>> sorted(td_keys(TensorDict({"a": torch.zeros(1)}, [])))
        ['a']
    """
    return iter(td.keys(nested, leaves, is_leaf))  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]


def td_items(
    td: TensorDictBase, *, nested: bool = False, leaves: bool = False
) -> Iterator[tuple[NestedKey, Any]]:
    """The entries of ``td`` (``td.items(nested, leaves)``), typed; values are tensors,
    tensordicts or non-tensor entries.

    Example:
        >>> from tensordict import TensorDict
        >>> [k for k, _ in td_items(TensorDict({"a": torch.zeros(1)}, []))]
        ['a']
    """
    return iter(td.items(nested, leaves))  # pyright: ignore[reportUnknownMemberType]


def td_get(td: TensorDictBase, key: NestedKey, default: Any = None) -> Any:
    """``td.get(key, default)``, typed.

    Example:
        >>> from tensordict import TensorDict
        >>> td_get(TensorDict({}, []), "missing") is None
        True
    """
    return td.get(key, default)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


def td_clone(td: TensorDictBase) -> TensorDictBase:
    """``td.clone()``, typed: a TensorDict holding copies of ``td``'s tensors.

    Example:
        >>> td = TensorDict({"a": torch.zeros(1)})
        >>> td_clone(td)["a"] is td["a"]
        False
    """
    return td.clone()  # pyright: ignore[reportUnknownMemberType]


def lazy_stack(tds: Sequence[TensorDictBase]) -> LazyStackedTensorDict:
    """``tensordict.lazy_stack(tds)`` along a new first dim, typed.

    Example:
        >>> lazy_stack([TensorDict({"a": torch.zeros(1)}), TensorDict({"b": torch.zeros(2)})]).batch_size
        torch.Size([2])
    """
    return tensordict.lazy_stack(tds)  # pyright: ignore[reportUnknownMemberType, reportReturnType]


def maybe_dense_stack(tds: Sequence[TensorDictBase]) -> TensorDictBase:
    """``tensordict.maybe_dense_stack(tds)``, typed: a dense stack where every TensorDict has
    the same layout, else a lazy one.

    Example:
        >>> type(maybe_dense_stack([TensorDict({"a": torch.zeros(1)})] * 2)).__name__
        'TensorDict'
    """
    return tensordict.maybe_dense_stack(tds)  # pyright: ignore[reportUnknownMemberType]


def non_tensor_stack(values: list[Any]) -> NonTensorStack:
    """``NonTensorStack.from_list(values)``, typed: one non-tensor entry per row.

    Example:
        >>> non_tensor_stack(["a", None]).tolist()
        ['a', None]
    """
    return NonTensorStack.from_list(values)  # pyright: ignore[reportUnknownMemberType]


def td_unchecked(
    source: Mapping[str, Any], batch_size: torch.Size, device: torch.device | None = None
) -> TensorDict:
    """A TensorDict of ``source`` (nested dicts become TensorDicts) without the constructor's
    checks: for entries known to have the batch's leading dims, where the checks would cost
    as much as the rest of the batch.

    Example:
        >>> td_unchecked({"a": torch.zeros(2, 3)}, torch.Size([2]))["a"].shape
        torch.Size([2, 3])
    """
    return TensorDict._new_unsafe(source, batch_size=batch_size, device=device)  # pyright: ignore[reportPrivateUsage, reportArgumentType]


def root_entries(td: TensorDictBase) -> dict[str, Any]:
    """The root entries of ``td`` (tensors, TensorDicts, non-tensor data) by key. For a
    TensorDict, its own dict, read without ``items()``'s generic machinery: read-only.

    Example:
        >>> list(root_entries(TensorDict({"a": torch.zeros(1)})))
        ['a']
    """
    if type(td) is TensorDict:
        return td._tensordict  # pyright: ignore[reportPrivateUsage, reportUnknownMemberType, reportUnknownVariableType]
    return dict(td.items())  # pyright: ignore[reportUnknownMemberType]


def td_update(td: TensorDictBase, entries: Mapping[str, Any]) -> None:
    """``td.update(entries)``, typed: nested mappings update sub-TensorDicts in place.

    Example:
        >>> td = TensorDict({"a": {"b": torch.zeros(1)}})
        >>> td_update(td, {"a": {"c": torch.ones(1)}})
        >>> sorted(td["a"].keys())
        ['b', 'c']
    """
    td.update(entries)  # pyright: ignore[reportUnknownMemberType]


def flat_entries(td: TensorDictBase, non_tensor: bool = False) -> dict[str, Any] | None:
    """The root entries of a TensorDict that holds only tensors at its root and has no dim
    names (what a sent batch usually is), read without tensordict's generic machinery (which
    costs more than the rest of a batch); None for any other TensorDict. Read-only.
    ``non_tensor``: non-tensor entries (``NonTensorData`` / ``NonTensorStack``) may be there too.

    Example:
        >>> flat_entries(TensorDict({"a": torch.zeros(1)})) is not None
        True
        >>> flat_entries(TensorDict({"a": {"b": torch.zeros(1)}})) is None
        True
    """
    if type(td) is not TensorDict or td._has_names():  # pyright: ignore[reportPrivateUsage]
        return None
    entries: dict[str, Any] = td._tensordict  # pyright: ignore[reportPrivateUsage, reportUnknownMemberType, reportUnknownVariableType]
    if non_tensor:
        plain = all(type(v) is torch.Tensor or type(v) in _NON_TENSOR for v in entries.values())
    else:
        plain = all(type(v) is torch.Tensor for v in entries.values())
    return entries if plain else None


_NON_TENSOR = (NonTensorData, NonTensorStack)
