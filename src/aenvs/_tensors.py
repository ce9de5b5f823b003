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
    "non_tensor_data",
    "non_tensor_row",
    "non_tensor_rows",
    "non_tensor_values",
    "plain_value",
    "root_entries",
    "shallow_copy",
    "td_clone",
    "td_get",
    "td_index",
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


def td_index(td: TensorDictBase, index: Any) -> TensorDictBase:
    """``td[index]``, typed: rows of a TensorDict (an int drops the first dim).

    Example:
        >>> td_index(TensorDict({"a": torch.arange(3)}, [3]), 1)["a"].item()
        1
    """
    return td[index]  # pyright: ignore[reportUnknownVariableType]


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

    A list of plain values (``str``, ``bytes``, numbers, ``None``: text, mostly) is built
    directly, as the same objects the constructor builds (see :class:`_FlatStacks`), for a
    fraction of its cost; anything else (a token list, which becomes a nested stack, a
    message dict, a tensor...) goes through ``from_list``.

    Example:
        >>> non_tensor_stack(["a", None]).tolist()
        ['a', None]
        >>> built, made = non_tensor_stack(["go", "look"]), NonTensorStack.from_list(["go", "look"])
        >>> built[1].data == made[1].data and type(built[1]) is type(made[1])
        True
    """
    flat = _FlatStacks.get()
    if flat is not None and values and all(type(v) in _FLAT_TYPES for v in values):
        return flat.stack(values)
    return NonTensorStack.from_list(values)  # pyright: ignore[reportUnknownMemberType]


def non_tensor_values(stack: NonTensorStack) -> list[Any]:
    """``stack.tolist()`` for a one-dim stack: each row's value, read without building
    anything for rows that are plain ``NonTensorData`` (what :func:`non_tensor_stack` builds).

    Example:
        >>> non_tensor_values(non_tensor_stack(["go", "look"]))
        ['go', 'look']
    """
    flat = _FlatStacks.get()
    if flat is not None and type(stack) is NonTensorStack and stack.stack_dim == 0 and stack.batch_dims == 1:
        values = flat.values(stack)
        if values is not None:
            return values
    return list(stack.tolist())  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]


def non_tensor_data(value: Any) -> NonTensorData:
    """``NonTensorData(value)`` with batch ``[]``; a plain value (text, mostly) built directly,
    as :func:`non_tensor_stack` builds its rows.

    Example:
        >>> non_tensor_data("go").data, type(non_tensor_data("go")) is NonTensorData
        ('go', True)
    """
    flat = _FlatStacks.get()
    if flat is not None and type(value) in _FLAT_TYPES:
        return flat.row(value)
    return NonTensorData(value, batch_size=[])  # pyright: ignore[reportCallIssue]


def non_tensor_row(value: Any, row: int) -> Any:
    """Row ``row``'s value of a non-tensor entry: a stack's row, one ``NonTensorData``'s value,
    None where there is no entry (``value`` None); reads that row only.

    Example:
        >>> non_tensor_row(non_tensor_stack(["go", "look"]), 1), non_tensor_row(None, 0)
        ('look', None)
    """
    if type(value) is NonTensorStack and value.stack_dim == 0 and value.batch_dims == 1:
        item: Any = value.tensordicts[row]
        if type(item) is _ROW and not item._tensordict._batch_size:
            data = item._non_tensordict.get("data", _NO_VALUE)
            if data is not _NO_VALUE:
                return data
        return non_tensor_values(value)[row]
    if isinstance(value, NonTensorStack):
        return non_tensor_values(value)[row]
    if isinstance(value, NonTensorData):
        return value.data
    return None


def non_tensor_rows(value: Any, n: int) -> list[Any]:
    """The ``n`` per-row values of a non-tensor entry: a stack's rows, one ``NonTensorData``'s
    value repeated, None for each row where there is no entry (``value`` None).

    Example:
        >>> non_tensor_rows(NonTensorData("go", batch_size=[2]), 2), non_tensor_rows(None, 2)
        (['go', 'go'], [None, None])
    """
    if isinstance(value, NonTensorStack):
        return non_tensor_values(value)
    if isinstance(value, NonTensorData):
        return [value.data] * n
    return [None] * n


_FLAT_TYPES = frozenset({str, bytes, int, float, bool, type(None)})
"""Values that ``NonTensorData`` stores as they are (no copy, no conversion)."""
_NO_VALUE = object()
# the classes, untyped: the fast paths read and set their private attributes
_STACK: Any = NonTensorStack
_ROW: Any = NonTensorData
_TD: Any = TensorDict


def _state(obj: object) -> dict[str, Any]:
    """An object's attributes (``vars``), or {} for None: to check a layout, not on the hot path."""
    return {} if obj is None else vars(obj)


class _FlatStacks:
    """Builds and reads one-dim stacks of plain values without tensordict's constructors,
    which build and check each row generically (several microseconds a row on tensordict
    0.14; tensordict 0.15 has a fast path of its own, still slower than this).

    The layout of what the constructors build (a ``NonTensorStack`` holding one
    ``NonTensorData`` per row, each holding an empty ``TensorDict`` and a dict whose
    ``"data"`` is the value) is read once from ``NonTensorStack.from_list``; a tensordict
    version whose objects do not look like that (attributes this does not know) gets no
    fast path (:meth:`get` returns None) and every call goes through the constructors.
    """

    _instance: _FlatStacks | None = None
    _checked = False
    _ROW_ATTRS = frozenset({"_tensordict", "_non_tensordict", "_is_initialized"})
    _INNER_ATTRS = frozenset({"_device", "_tensordict", "_batch_size", "_td_dim_names"})
    _STACK_SIZED = frozenset({"tensordicts", "_batch_size"})

    def __init__(self, template: Any) -> None:
        row, inner = template.tensordicts[0], template.tensordicts[0]._tensordict
        self._row_state: dict[str, Any] = {k: v for k, v in row._non_tensordict.items() if k != "data"}
        self._inner_dict_type: type[Any] = type(inner._tensordict)
        self._empty: torch.Size = inner._batch_size
        self._stack_attrs: list[tuple[str, Any]] = [
            (k, v) for k, v in _state(template).items() if k not in self._STACK_SIZED
        ]

    @classmethod
    def get(cls) -> _FlatStacks | None:
        """The builder, or None where this tensordict's objects differ from what it builds."""
        if not cls._checked:
            cls._checked = True
            cls._instance = cls._verified()
        return cls._instance

    @classmethod
    def _verified(cls) -> _FlatStacks | None:
        values: list[Any] = ["a", None]
        template: Any = NonTensorStack.from_list(values)  # pyright: ignore[reportUnknownMemberType]
        rows: list[Any] = list(template.tensordicts)
        stack_state = _state(template)
        inner = _state(_state(rows[0]).get("_tensordict"))
        plain = (
            type(template) is _STACK
            and frozenset(stack_state) >= cls._STACK_SIZED
            and all(
                type(v) in (type(None), int, bool, str)
                for k, v in stack_state.items()
                if k not in cls._STACK_SIZED
            )
            and all(type(r) is _ROW and frozenset(_state(r)) == cls._ROW_ATTRS for r in rows)
            and type(_state(rows[0])["_tensordict"]) is _TD
            and frozenset(inner) == cls._INNER_ATTRS
            and not inner["_tensordict"]
            and inner["_device"] is None
            and inner["_td_dim_names"] is None
            and not inner["_batch_size"]
            and _state(rows[0])["_non_tensordict"].get("data") == "a"
        )
        if not plain:
            return None
        flat = cls(template)
        built = flat.stack(values)
        built_rows: list[Any] = built.tensordicts
        same = (
            _state(built).keys() == stack_state.keys()
            and built.tolist() == values
            and flat.values(template) == values
            and all(
                _state(a).keys() == _state(b).keys()
                and _state(a)["_non_tensordict"] == _state(b)["_non_tensordict"]
                and _state(_state(a)["_tensordict"]) == _state(_state(b)["_tensordict"])
                for a, b in zip(built_rows, rows, strict=True)
            )
        )
        return flat if same else None

    def row(self, value: Any) -> NonTensorData:
        """One row of a stack: a ``NonTensorData`` of ``value`` (a plain value), batch ``[]``."""
        setattr_, new = object.__setattr__, object.__new__
        inner = new(_TD)
        setattr_(inner, "_device", None)
        setattr_(inner, "_tensordict", self._inner_dict_type())
        setattr_(inner, "_batch_size", self._empty)
        setattr_(inner, "_td_dim_names", None)
        row = new(_ROW)
        setattr_(row, "_tensordict", inner)
        setattr_(row, "_non_tensordict", {"data": value, **self._row_state})
        setattr_(row, "_is_initialized", True)
        return row

    def stack(self, values: list[Any]) -> NonTensorStack:
        """The stack of ``values`` (plain values, at least one)."""
        setattr_, new = object.__setattr__, object.__new__
        row = self.row
        rows: list[Any] = [row(value) for value in values]
        stack = new(_STACK)
        for key, value in self._stack_attrs:
            setattr_(stack, key, value)
        setattr_(stack, "_batch_size", torch.Size([len(rows)]))
        setattr_(stack, "tensordicts", rows)
        return stack

    def values(self, stack: NonTensorStack) -> list[Any] | None:
        """Each row's value, or None if a row is not a plain ``NonTensorData``."""
        out: list[Any] = []
        append = out.append
        rows: list[Any] = stack.tensordicts
        for row in rows:
            if type(row) is not _ROW or row._tensordict._batch_size:
                return None
            value = row._non_tensordict.get("data", _NO_VALUE)
            if value is _NO_VALUE:
                return None
            append(value)
        return out


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


def plain_value(value: Any) -> Any:
    """``value`` with the tensors the pool made of numbers turned back into numpy (a 0-d one
    into a Python number), and TensorDicts into dicts.

    Example:
        >>> plain_value({"a": torch.tensor([1, 2])})
        {'a': array([1, 2])}
    """
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu()
        return tensor.item() if tensor.ndim == 0 else tensor.numpy()
    if isinstance(value, TensorDictBase):
        return plain_value(value.to_dict())
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in cast("dict[str, Any]", value).items()}
    return value


def shallow_copy(td: TensorDictBase) -> TensorDictBase:
    """``td.copy()``: a new TensorDict holding the same tensors, so that later key changes to
    ``td`` do not reach it; for a flat TensorDict, for a tenth of ``copy()``'s cost (whose
    clone of a non-tensor stack builds every row again: sent text shares its stack)."""
    entries = flat_entries(td, non_tensor=True)
    if entries is None:
        return td.copy()
    return td_unchecked(dict(entries), td.batch_size, td.device)
