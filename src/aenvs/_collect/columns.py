"""Received batches read row by row, and TensorDicts built from rows of many batches.

A collector keeps each transition as references to rows of the batches it came in (the
policy's batch and the pool's result batch), and builds an episode or a batch of frames
once, key by key, when it is handed out: no TensorDict per step, no copy per step.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from tensordict import LazyStackedTensorDict, NonTensorData, NonTensorStack, TensorDictBase

from aenvs._tensors import (
    from_numpy,
    maybe_dense_stack,
    non_tensor_data,
    non_tensor_stack,
    non_tensor_values,
    td_index,
    td_items,
    td_unchecked,
)

__all__ = ["Columns", "build_rows", "build_transitions"]

_NON_TENSOR = (NonTensorData, NonTensorStack)


class Columns:
    """The leaves of a one-dim batch, each readable per row: numpy views of CPU tensors,
    lists of values for non-tensor entries, the tensor itself otherwise (on a device,
    requiring grad). A lazy stack, or entries of other kinds, are read row by row as
    TensorDicts (:attr:`leaves` None).

    Example:
        >>> from tensordict import TensorDict
        >>> cols = Columns(TensorDict({"a": torch.arange(3), "b": {"c": torch.ones(3, 2)}}, [3]))
        >>> sorted(cols.leaves), int(cols.leaves[("a",)][2])
        ([('a',), ('b', 'c')], 2)
    """

    __slots__ = ("leaves", "td")

    def __init__(self, td: TensorDictBase) -> None:
        self.leaves: dict[tuple[str, ...], Any] | None = _leaves(td)
        # kept only where rows are read as TensorDicts: the batch's own objects (a row object
        # per text entry) would otherwise live as long as the episodes referring to it
        self.td: TensorDictBase | None = td if self.leaves is None else None

    @classmethod
    def of(cls, columns: Mapping[tuple[str, ...], Any], size: int) -> Columns:
        """The columns of a batch of ``size`` rows given leaf by leaf (numpy arrays, lists of
        values, tensors or non-tensor entries), as :meth:`AsyncEnvPool.async_step_recv_columns`
        gives them.

        Example:
            >>> import numpy as np
            >>> Columns.of({("reward",): np.ones((2, 1)), ("observation",): ["a", "b"]}, 2).leaves[("observation",)]
            ['a', 'b']
        """
        self = cls.__new__(cls)
        leaves: dict[tuple[str, ...], Any] = {}
        for key, value in columns.items():
            if isinstance(value, torch.Tensor):
                cpu = value.is_cpu and not value.requires_grad and value.dtype is not torch.bfloat16
                leaves[key] = value.numpy() if cpu else value
            elif type(value) is NonTensorStack:
                leaves[key] = non_tensor_values(value)
            elif type(value) is NonTensorData:
                leaves[key] = [value.data] * size
            else:
                leaves[key] = value
        self.leaves, self.td = leaves, None
        return self

    def row(self, row: int) -> TensorDictBase:
        """Row ``row`` as a TensorDict (the slow way, for what :attr:`leaves` cannot hold)."""
        if self.td is None:
            return td_unchecked(
                _nest({key: column[row] for key, column in (self.leaves or {}).items()}), torch.Size([])
            )
        return td_index(self.td, row)


def _leaves(td: TensorDictBase) -> dict[tuple[str, ...], Any] | None:
    if td.batch_dims != 1 or isinstance(td, LazyStackedTensorDict):
        return None
    leaves: dict[tuple[str, ...], Any] = {}
    for key, value in td_items(td, nested=True):
        path = cast("tuple[str, ...]", (key,) if isinstance(key, str) else tuple(key))
        if isinstance(value, torch.Tensor):
            if value.is_cpu and not value.requires_grad and value.dtype is not torch.bfloat16:
                leaves[path] = value.numpy()
            else:
                leaves[path] = value
        elif type(value) is NonTensorStack:
            leaves[path] = non_tensor_values(value)
        elif type(value) is NonTensorData:
            leaves[path] = [value.data] * td.batch_size[0]
        elif isinstance(value, TensorDictBase):
            if isinstance(value, LazyStackedTensorDict):
                return None
            continue  # a sub-TensorDict: its leaves come on their own
        else:
            return None
    return leaves


def build_rows(
    batches: Sequence[Columns],
    rows: Sequence[int],
    exclude: Collection[str] = (),
    *,
    common: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> TensorDictBase:
    """The TensorDict of rows ``rows[j]`` of ``batches[j]`` (batch ``[len(rows)]``), root
    entries named in ``exclude`` left out; with ``common``, only the entries every batch has
    (a reset's infos and a step's often differ); ``extra``: root entries to add (tensors of
    ``len(rows)`` rows).

    Built key by key where every batch has the same leaves (one array per key), else as a
    stack of the rows (lazy where they differ).

    Example:
        >>> from tensordict import TensorDict
        >>> a = Columns(TensorDict({"x": torch.tensor([1, 2])}, [2]))
        >>> b = Columns(TensorDict({"x": torch.tensor([3])}, [1]))
        >>> build_rows([a, b], [1, 0])["x"].tolist()
        [2, 3]
    """
    exclude = frozenset(exclude)
    keys: list[tuple[str, ...]] | None = None
    seen: set[int] = set()
    for cols in batches:  # every batch the rows come from (usually a few) must agree
        if id(cols) in seen:
            continue
        seen.add(id(cols))
        leaves = cols.leaves
        if leaves is None:
            return _with(_stack_rows(batches, rows, exclude), extra)
        these = [key for key in leaves if key[0] not in exclude]
        if keys is None:
            keys = these
        elif set(these) != set(keys):
            if not common:
                return _with(_stack_rows(batches, rows, exclude), extra)
            keys = [key for key in keys if key in leaves]
    assert keys is not None
    source: dict[str, Any] = {}
    first = batches[0].leaves
    assert first is not None
    pairs = list(zip(batches, rows, strict=True))
    for key in keys:
        values: list[Any] = [cols.leaves[key][r] for cols, r in pairs]  # pyright: ignore[reportOptionalSubscript]
        first_column: Any = first[key]
        if isinstance(first_column, np.ndarray):
            column: Any = _stack_arrays(values)
        elif isinstance(first_column, torch.Tensor):
            column = torch.stack(values)
        else:
            column = non_tensor_stack(values)
        if column is None:  # rows of differing shapes: a lazy stack of the rows
            return _with(_stack_rows(batches, rows, exclude), extra)
        _put(source, key, column)
    if extra:
        source.update(extra)
    return td_unchecked(source, torch.Size([len(rows)]))


def _with(td: TensorDictBase, extra: Mapping[str, Any] | None) -> TensorDictBase:
    for key, value in (extra or {}).items():
        td.set(key, value)  # pyright: ignore[reportUnknownMemberType]
    return td


def build_transitions(record: Sequence[Any]) -> TensorDictBase:
    """The TensorDict of transitions recorded flat, four items each: the policy's batch and
    row (the root), the result's batch and row (under ``"next"``).

    Example:
        >>> from tensordict import TensorDict
        >>> acted = Columns(TensorDict({"action": torch.tensor([1, 0])}, [2]))
        >>> stepped = Columns(TensorDict({"reward": torch.ones(2, 1)}, [2]))
        >>> td = build_transitions([acted, 1, stepped, 0, acted, 0, stepped, 1])
        >>> td["action"].tolist(), td["next", "reward"].shape
        ([0, 1], torch.Size([2, 1]))
    """
    td = build_rows(record[0::4], record[1::4])
    td.set("next", build_rows(record[2::4], record[3::4]))  # pyright: ignore[reportUnknownMemberType]
    return td


def _stack_rows(batches: Sequence[Columns], rows: Sequence[int], exclude: frozenset[str]) -> TensorDictBase:
    tds = [cols.row(r) for cols, r in zip(batches, rows, strict=True)]
    if exclude:
        tds = [td.exclude(*(k for k in exclude if k in td.keys())) for td in tds]  # pyright: ignore[reportUnknownMemberType]
    return maybe_dense_stack(tds)


def _stack_arrays(values: list[Any]) -> torch.Tensor | None:
    try:
        return from_numpy(np.stack(values))
    except ValueError:
        return None


def _nest(flat: dict[tuple[str, ...], Any]) -> dict[str, Any]:
    source: dict[str, Any] = {}
    for key, value in flat.items():
        _put(
            source,
            key,
            from_numpy(np.asarray(cast(Any, value)))
            if isinstance(value, np.ndarray | np.generic)
            else value
            if isinstance(value, torch.Tensor)
            else non_tensor_data(value),
        )
    return source


def _put(source: dict[str, Any], key: tuple[str, ...], value: Any) -> None:
    for part in key[:-1]:
        source = source.setdefault(part, {})
    source[key[-1]] = value
