"""Batches in and out of the buffers: actions from TensorDicts, results into TensorDicts.

This is the only module that stacks. A dense pool (every env with one layout)
builds one TensorDict per batch with one indexing operation per leaf; a lazy pool
builds one TensorDict per env and stacks them lazily (tensordict's
``LazyStackedTensorDict``), so envs with different keys or shapes share a pool.
Entries without a fixed shape (infos, strings) are stacked per key, densely when
they agree and lazily when they do not; none is dropped.
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

from aenvs._buffers import Buffers
from aenvs._commands import Completion
from aenvs._object_actions import ObjectActions
from aenvs._specs import OBJECT, EnvSpec, Key, Leaf
from aenvs._tensors import (
    flat_entries,
    from_numpy,
    lazy_stack,
    maybe_dense_stack,
    non_tensor_stack,
    root_entries,
    td_get,
    td_items,
    td_unchecked,
    td_update,
    torch_dtype,
)

__all__ = ["Batcher", "lazy_legacy_env_kept", "shallow_copy", "to_td_value"]

Inputs = tuple[TensorDictBase, int]  # the batch an env's command came in, and its row there
_ENV_INDEX = ("env_index",)


def _long(indices: Sequence[int]) -> torch.Tensor:
    """An int64 index tensor of ``indices``, through numpy: a third of what ``torch.tensor(list)`` costs."""
    return from_numpy(np.array(indices, dtype=np.int64))


def _name(key: Key) -> str:
    return ".".join(key)


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


def _put(tree: dict[str, Any], key: Key, value: Any) -> None:
    """``tree[key[0]]...[key[-1]] = value``, making the inner dicts on the way."""
    for part in key[:-1]:
        tree = tree.setdefault(part, {})
    tree[key[-1]] = value


def _nest(extras: Mapping[Key, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for key, value in extras.items():
        _put(nested, key, value)
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


def _stack_values(values: Sequence[Any]) -> Any:
    """Stack one entry across envs (``_MISSING`` where an env lacks it), losing nothing."""
    if all(isinstance(v, Mapping) or v is _MISSING for v in values):
        tds = [TensorDict(to_td_value(v) if v is not _MISSING else {}, batch_size=[]) for v in values]
        try:
            return maybe_dense_stack(tds)
        except (RuntimeError, ValueError, TypeError):
            return lazy_stack(tds)
    # a value no tensor can hold (text, a message...) makes this a non-tensor stack: convert
    # nothing first (each conversion would build a NonTensorData the stack builds again)
    numeric = all(isinstance(v, _TENSOR_LIKE) for v in values)
    converted = [to_td_value(v) for v in values] if numeric else []
    if numeric and all(isinstance(v, torch.Tensor) for v in converted):
        first = converted[0]
        if all(v.shape == first.shape and v.dtype == first.dtype for v in converted):
            return torch.stack(converted)
    return non_tensor_stack([None if v is _MISSING else v for v in values])


def _stack_extras(td: TensorDictBase, extras: Sequence[Mapping[Key, Any] | None]) -> None:
    """Set every extra entry of a batch into ``td`` (batch [len(extras)]), stacked per key."""
    nested = [_nest(e) if e else {} for e in extras]
    with lazy_legacy_env_kept():
        for key in sorted({k for n in nested for k in n}):
            td.set(key, _stack_values([n.get(key, _MISSING) for n in nested]))


class Batcher:
    """Moves batches between TensorDicts and a pool's buffers.

    Args:
        specs: one per env.
        buffers: the pool's buffers (numpy; viewed here as tensors, no copy).
        dense: stack every batch densely (requires one layout for every env).
    """

    def __init__(self, specs: Sequence[EnvSpec], buffers: Buffers, dense: bool) -> None:
        self.specs = specs
        self.dense = dense
        self._location = buffers.location
        self._groups = [
            (
                {k: from_numpy(v) for k, v in g.reset.items()},
                {k: from_numpy(v) for k, v in g.step.items()},
                # object rows (non-tensor actions) travel with the command instead
                {k: from_numpy(v) for k, v in g.action.items() if v.dtype != OBJECT},
            )
            for g in buffers.groups
        ]
        self._tensor_actions = [tuple(leaf for leaf in s.action_leaves if not leaf.is_object) for s in specs]
        self._action_dtypes = [
            {leaf.key: torch_dtype(leaf.dtype) for leaf in leaves} for leaves in self._tensor_actions
        ]
        self.objects = ObjectActions(specs)
        self._all_rows = list(range(len(specs)))
        self._arange = torch.arange(len(specs))
        # the dense path copies rows in numpy: between the pool's other work a torch op costs
        # several times what numpy's take does (9-13 us against 1.7 us for 50 rows here)
        self._dense_plan = (list(buffers.groups[0].reset.items()), list(buffers.groups[0].step.items()))
        self._dense_actions = [
            (k, self._groups[0][2][k], a) for k, a in buffers.groups[0].action.items() if a.dtype != OBJECT
        ]
        self._sent_actions = {key: array for key, _, array in self._dense_actions}  # by key, for receives

    # -- actions in ---------------------------------------------------------------

    def check_actions(self, td: TensorDictBase, env_indices: Sequence[int]) -> None:
        """Raise ValueError naming the env and the key if ``td`` does not fit the action spaces."""
        if self.dense:
            self._check_leaves(
                td,
                env_indices[0],
                self._tensor_actions[0],
                self._action_dtypes[0],
                1,
                others=len(env_indices) - 1,
            )
            return
        for row, i in enumerate(env_indices):
            self._check_leaves(td[row], i, self._tensor_actions[i], self._action_dtypes[i], 0)

    def _check_leaves(
        self,
        td: TensorDictBase,
        env_index: int,
        leaves: Sequence[Leaf],
        dtypes: Mapping[Key, torch.dtype],
        batch_dims: int,
        others: int = 0,
    ) -> None:
        who = f"env {env_index}" + (f" (and {others} more)" if others else "")
        space = self.specs[env_index].action_space
        for leaf in leaves:
            value = td_get(td, leaf.key)
            if value is None:
                raise ValueError(
                    f"{who}: the input has no {_name(leaf.key)!r} entry; its action space is {space}"
                )
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{who}: {_name(leaf.key)!r} must be a tensor, got {type(value).__name__}")
            shape = tuple(value.shape[batch_dims:])
            if shape != leaf.shape:
                raise ValueError(
                    f"{who}: {_name(leaf.key)!r} has shape {shape} per env, expected {leaf.shape} "
                    f"for the action space {space}"
                )
            if value.dtype != dtypes[leaf.key]:
                raise ValueError(
                    f"{who}: {_name(leaf.key)!r} has dtype {value.dtype}, expected {dtypes[leaf.key]} "
                    f"for the action space {space}"
                )

    def write_actions(self, td: TensorDictBase, env_indices: Sequence[int]) -> None:
        """Copy the (checked) actions of ``td`` into the envs' action rows."""
        if self.dense:
            whole = list(env_indices) == self._all_rows
            rows = None if whole else np.array(env_indices, dtype=np.int64)
            for key, buf, array in self._dense_actions:
                value: torch.Tensor = td[key]  # a tensor: check_actions saw it
                if value.requires_grad:  # a policy's output: the env needs its value, not its graph
                    value = value.detach()
                if whole:
                    buf.copy_(value)
                    continue
                view = _numpy_view(value)
                if view is not None:
                    array[rows] = view
                else:
                    buf[from_numpy(cast("npt.NDArray[np.int64]", rows))] = value
            return
        for row, i in enumerate(env_indices):
            group, slot = self._location[i]
            env_td = td[row]
            for key, buf in self._groups[group][2].items():
                buf[slot] = env_td[key].detach()

    # -- results out --------------------------------------------------------------

    def _dense_source(self, rows: npt.NDArray[np.int64] | None, which: int) -> dict[str, Any]:
        """Copies of the buffer ``rows`` (None: all, in order) as nested tensors (``which``
        0: reset buffers, 1: step buffers)."""
        source: dict[str, Any] = {}
        for key, buf in self._dense_plan[which]:
            _put(source, key, from_numpy(buf.copy() if rows is None else buf.take(rows, axis=0)))
        return source

    def _lazy_rows(self, env_indices: Sequence[int], which: int) -> LazyStackedTensorDict:
        per_env: list[TensorDictBase] = []
        for i in env_indices:
            group, row = self._location[i]
            per_env.append(TensorDict({k: b[row].clone() for k, b in self._groups[group][which].items()}, []))
        return lazy_stack(per_env)

    def _rows(
        self,
        env_indices: Sequence[int],
        which: int,
        extras: Sequence[Mapping[Key, Any] | None],
        rows: npt.NDArray[np.int64] | None,
        env_index: torch.Tensor | None = None,
    ) -> TensorDictBase:
        """The results of ``env_indices`` (``rows``: the same as an array, None for all envs
        in order) as one TensorDict, with their extra entries, and ``env_index`` as the entry
        "env_index" if given."""
        if not self.dense:
            td = self._lazy_rows(env_indices, which)
            env_tds: list[TensorDictBase] = td.tensordicts
            for env_td, env_extras in zip(env_tds, extras, strict=True):
                if env_extras:
                    td_update(env_td, {k: to_td_value(v) for k, v in _nest(env_extras).items()})
            if env_index is not None:
                td.set("env_index", env_index)
            return td
        # every entry was just copied out of a buffer with the batch's leading dim, so the
        # TensorDict constructor's checks are skipped (td_unchecked): they cost half a batch
        source = self._dense_source(rows, which)
        if not any(extras):  # the common case: built whole, without a TensorDict.set per key
            if env_index is not None:
                source["env_index"] = env_index
            return td_unchecked(source, torch.Size([len(env_indices)]))
        td = td_unchecked(source, torch.Size([len(env_indices)]))
        _stack_extras(td, extras)
        if env_index is not None:
            td.set("env_index", env_index)
        return td

    def _inputs(self, inputs: Sequence[Inputs], env_rows: npt.NDArray[np.int64] | None) -> TensorDictBase:
        """The sent entries of a batch, whose envs may have been sent in different batches
        (``env_rows``: the batch's envs as buffer rows, None for every env in order). Its
        "env_index" may be left out: the batch sets its own."""
        first = inputs[0][0]
        single = all(td is first for td, _ in inputs)
        if single:
            rows = [row for _, row in inputs]
            if rows == list(range(first.batch_size[0])):
                return first
        if self.dense or (single and flat_entries(first) is not None):
            # a dense pool's action rows hold what each env was sent: one copy per action key
            sent_actions = (self._sent_actions, env_rows) if self.dense else None
            gathered = _gather_dense(inputs, sent_actions)
            if gathered is not None:
                return gathered
        if single:
            return first[_long([row for _, row in inputs])]
        parts: list[TensorDictBase] = [td[row] for td, row in inputs]
        return maybe_dense_stack(parts) if self.dense else lazy_stack(parts)

    def empty(self) -> TensorDictBase:
        """The result of a receive that found nothing (``min_get=0``)."""
        return TensorDict({"env_index": torch.zeros(0, dtype=torch.long)}, batch_size=[0])

    def _index(self, indices: list[int]) -> tuple[npt.NDArray[np.int64] | None, torch.Tensor]:
        """``indices`` as buffer rows (None: every env, in order) and as the "env_index" entry."""
        if indices == self._all_rows:
            return None, self._arange.clone()
        rows = np.array(indices, dtype=np.int64)
        return rows, from_numpy(rows)

    def reset_batch(self, completions: Sequence[Completion]) -> TensorDictBase:
        indices = [c.env_index for c in completions]
        rows, env_index = self._index(indices)
        return self._rows(indices, 0, [c.extras for c in completions], rows, env_index)

    def step_batch(self, completions: Sequence[Completion], inputs: Sequence[Inputs]) -> TensorDictBase:
        """TorchRL's step layout: the sent entries at the root, the results under "next"."""
        indices = [c.env_index for c in completions]
        return self._step_batch(completions, inputs, indices, *self._index(indices))

    def _step_batch(
        self,
        completions: Sequence[Completion],
        inputs: Sequence[Inputs],
        indices: list[int],
        rows: npt.NDArray[np.int64] | None,
        env_index: torch.Tensor,
    ) -> TensorDictBase:
        nxt = self._rows(indices, 1, [c.extras for c in completions], rows)
        sent = self._inputs(inputs, rows)
        if self.dense:
            root = root_entries(sent)
            return td_unchecked({**root, "next": nxt, "env_index": env_index}, torch.Size([len(indices)]))
        out = sent.copy() if hasattr(sent, "tensordicts") else lazy_stack(list(sent.unbind(0)))
        out.set("next", nxt)
        out.set("env_index", env_index)
        return out

    def step_and_reset_batch(
        self, completions: Sequence[Completion], inputs: Sequence[Inputs]
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """``step_batch``, and the next step's input: reset observations where an episode ended."""
        indices = [c.env_index for c in completions]
        rows, env_index = self._index(indices)
        out = self._step_batch(completions, inputs, indices, rows, env_index)
        # its own env_index: the caller may write into one of the two
        nxt = self._rows(indices, 0, [c.reset_extras for c in completions], rows, env_index.clone())
        return out, nxt


def shallow_copy(td: TensorDictBase) -> TensorDictBase:
    """``td.copy()``: a new TensorDict holding the same tensors, so that later key changes to
    ``td`` do not reach it; for a flat TensorDict, for a tenth of ``copy()``'s cost (whose
    clone of a non-tensor stack builds every row again: sent text shares its stack)."""
    entries = flat_entries(td, non_tensor=True)
    if entries is None:
        return td.copy()
    return td_unchecked(dict(entries), td.batch_size, td.device)


def _gather_dense(
    inputs: Sequence[Inputs],
    sent_actions: tuple[Mapping[Key, npt.NDArray[Any]], npt.NDArray[np.int64] | None] | None = None,
) -> TensorDict | None:
    """Rows from several sent batches with the same tensor entries: one gather per batch and
    key, not one TensorDict per env (the overlapped loop's case). None when entries differ.

    "env_index" is left out (the batch sets its own). ``sent_actions``: the pool's action rows
    by key and the envs' rows there (None: every env, in order); an action entry of plain CPU
    tensors is copied from them with one ``take`` instead of gathered batch by batch (they
    hold what each env was sent; a policy's output that requires grad or lives on a device
    is gathered as sent)."""
    batches = list({id(td): td for td, _ in inputs}.values())  # each sent batch once, in order
    layouts: list[Mapping[Any, Any]] = []
    for td in batches:
        leaves: Mapping[Any, Any] | None = flat_entries(td)
        if leaves is None:
            leaves = dict(td_items(td, nested=True, leaves=True))
            if not all(isinstance(v, torch.Tensor) for v in leaves.values()):
                return None
        layouts.append(leaves)
    keys = layouts[0].keys()
    tail = inputs[0][0].batch_size[1:]  # batch dims past the envs', kept
    if any(leaves.keys() != keys for leaves in layouts[1:]) or any(
        td.batch_size[1:] != tail for td in batches
    ):
        return None
    action_rows: Mapping[Key, npt.NDArray[Any]] = {}
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
            value = from_numpy(sent.copy() if env_rows is None else sent.take(env_rows, axis=0))
        else:
            places = places or _places(inputs)
            value = _gather_leaf(tensors, *places, len(inputs))
        _put(source, path, value)
    return td_unchecked(source, torch.Size([len(inputs), *tail]))


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
    arrays = [view for view in map(_numpy_view, tensors) if view is not None]
    if len(arrays) == len(tensors) and all(a.dtype == arrays[0].dtype for a in arrays):
        # in numpy where it can: torch's per-call overhead is most of the cost at these sizes
        first = arrays[0]
        gathered = np.empty((size, *first.shape[1:]), first.dtype)
        for array, r, p in zip(arrays, rows, positions, strict=True):
            gathered[p] = array[r]
        return from_numpy(gathered)
    # on a device, requiring grad, or a dtype numpy lacks
    order = from_numpy(np.argsort(np.concatenate(positions)))
    parts = [t[from_numpy(r)] for t, r in zip(tensors, rows, strict=True)]
    return torch.cat(parts)[order]


def _numpy_view(value: torch.Tensor) -> npt.NDArray[Any] | None:
    """A CPU tensor's memory as numpy, or None where numpy cannot view it."""
    if not value.is_cpu or value.requires_grad or value.dtype not in _NUMPY_DTYPES:
        return None
    return value.numpy()


_NUMPY_DTYPES = frozenset(
    {torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
    | {torch.float16, torch.float32, torch.float64, torch.complex64, torch.complex128}
)
