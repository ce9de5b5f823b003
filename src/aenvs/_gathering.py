"""The sent entries of a receive's envs, gathered from the batches they were sent in.

An overlapped loop receives envs sent in several batches (and a receive may take part of
one): their sent entries are gathered with one copy per batch and key, not one TensorDict
per env; text and other non-tensor entries row by row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from aenvs._extras import put
from aenvs._rows import pick_rows, put_rows
from aenvs._specs import Key
from aenvs._tensors import flat_entries, from_numpy, non_tensor_row, non_tensor_stack, td_items, td_unchecked

__all__ = ["Inputs", "SentInputs", "gather_dense", "numpy_view"]

Inputs = tuple[TensorDictBase, int]  # the batch an env's command came in, and its row there
#: what the results of a receive were sent with: per env, its batch and row there; or the one
#: batch whose rows they all are, in order (a whole-batch call's)
SentInputs = Sequence[Inputs] | TensorDictBase
_ENV_INDEX = ("env_index",)


def gather_dense(
    inputs: Sequence[Inputs],
    sent_actions: tuple[Mapping[Key, tuple[npt.NDArray[Any], Any]], npt.NDArray[np.int64] | None]
    | None = None,
) -> TensorDict | None:
    """Rows from several sent batches with the same tensor entries: one gather per batch and
    key, not one TensorDict per env (the overlapped loop's case). None when entries differ.

    "env_index" is left out (the batch sets its own). ``sent_actions``: the pool's action rows
    by key (each with its :func:`~aenvs._rows.row_items`) and the envs' rows there (None:
    every env, in order); an action entry of plain CPU tensors is copied from them with one
    pick instead of gathered batch by batch (they hold what each env was sent; a policy's
    output that requires grad or lives on a device is gathered as sent)."""
    batches = list({id(td): td for td, _ in inputs}.values())  # each sent batch once, in order
    layouts: list[Mapping[Any, Any]] = []
    objects: list[dict[Any, Any]] = []  # per batch: its non-tensor entries (text...), by key
    for td in batches:
        leaves: Mapping[Any, Any] | None = flat_entries(td)
        found: dict[Any, Any] = {}
        if leaves is None:
            # tensordict's leaves leave non-tensor entries out: every entry, split by kind
            entries = dict(td_items(td, nested=True))
            found = {k: v for k, v in entries.items() if type(v) in _NON_TENSOR}
            leaves = {k: v for k, v in entries.items() if isinstance(v, torch.Tensor)}
            if len(found) + len(leaves) != sum(not _is_sub_td(v) for v in entries.values()):
                return None  # entries of another kind (a lazy stack...)
        layouts.append(leaves)
        objects.append(found)
    keys = layouts[0].keys()
    object_keys = objects[0].keys()
    tail = inputs[0][0].batch_size[1:]  # batch dims past the envs', kept
    if (
        any(leaves.keys() != keys for leaves in layouts[1:])
        or any(found.keys() != object_keys for found in objects[1:])
        or any(td.batch_size[1:] != tail for td in batches)
        or (object_keys and tail)
    ):
        return None
    action_rows: Mapping[Key, tuple[npt.NDArray[Any], Any]] = {}
    env_rows: npt.NDArray[np.int64] | None = None
    if sent_actions is not None:
        action_rows, env_rows = sent_actions
    places: tuple[list[npt.NDArray[np.int64]], list[npt.NDArray[np.int64]]] | None = None
    source: dict[str, Any] = {}
    for key in keys:
        path = (key,) if isinstance(key, str) else tuple(key)
        if path == _ENV_INDEX:
            continue
        tensors = [leaves[key] for leaves in layouts]
        sent = action_rows.get(path)
        if sent is not None and all(t.is_cpu and not t.requires_grad for t in tensors):
            array, items = sent
            value = from_numpy(array.copy() if env_rows is None else pick_rows(array, env_rows, items))
        else:
            places = places or _places(inputs)
            value = _gather_leaf(tensors, *places, len(inputs))
        put(source, path, value)
    if object_keys:
        where = {id(td): b for b, td in enumerate(batches)}
        for key in object_keys:
            # row by row: a receive takes a few rows of batches sent whole (thousands of rows)
            values = [non_tensor_row(objects[where[id(td)]][key], row) for td, row in inputs]
            put(source, (key,) if isinstance(key, str) else tuple(key), non_tensor_stack(values))
    return td_unchecked(source, torch.Size([len(inputs), *tail]))


def _is_sub_td(value: Any) -> bool:
    """A sub-TensorDict (whose entries come on their own), not a non-tensor entry."""
    return isinstance(value, TensorDictBase) and type(value) not in _NON_TENSOR


def _places(inputs: Sequence[Inputs]) -> tuple[list[npt.NDArray[np.int64]], list[npt.NDArray[np.int64]]]:
    """Per sent batch (in order of first use): the rows taken from it, and their positions."""
    places: dict[int, tuple[list[int], list[int]]] = {}
    for position, (td, row) in enumerate(inputs):
        entry = places.get(id(td))
        if entry is None:
            entry = places[id(td)] = ([], [])
        entry[0].append(row)
        entry[1].append(position)
    rows = [np.array(r, dtype=np.int64) for r, _ in places.values()]
    return rows, [np.array(p, dtype=np.int64) for _, p in places.values()]


def _gather_leaf(
    tensors: Sequence[torch.Tensor],
    rows: Sequence[npt.NDArray[np.int64]],
    positions: Sequence[npt.NDArray[np.int64]],
    size: int,
) -> torch.Tensor:
    """One entry of a gather: ``tensors[b][rows[b]]`` placed at ``positions[b]``, for each sent batch b."""
    arrays = [view for view in map(numpy_view, tensors) if view is not None]
    if len(arrays) == len(tensors) and all(a.dtype == arrays[0].dtype for a in arrays):
        # in numpy where it can: torch's per-call overhead is most of the cost at these sizes
        first = arrays[0]
        gathered = np.empty((size, *first.shape[1:]), first.dtype)
        for array, r, p in zip(arrays, rows, positions, strict=True):
            put_rows(gathered, p, pick_rows(array, r))
        return from_numpy(gathered)
    # on a device, requiring grad, or a dtype numpy lacks
    order = from_numpy(np.argsort(np.concatenate(positions)))
    parts = [t[from_numpy(r)] for t, r in zip(tensors, rows, strict=True)]
    return torch.cat(parts)[order]


def numpy_view(value: torch.Tensor) -> npt.NDArray[Any] | None:
    """A CPU tensor's memory as numpy, or None where numpy cannot view it."""
    if not value.is_cpu or value.requires_grad or value.dtype not in _NUMPY_DTYPES:
        return None
    return value.numpy()


_NON_TENSOR = (NonTensorData, NonTensorStack)
_NUMPY_DTYPES = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
    | {torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128}
)
