"""Batches in and out of the buffers: actions from TensorDicts, results into TensorDicts.

A dense pool (every env with one layout) builds one TensorDict per batch with one
indexing operation per leaf; a lazy pool builds one TensorDict per env and stacks them
lazily (tensordict's ``LazyStackedTensorDict``), so envs with different keys or shapes
share a pool. Entries without a fixed shape (infos, text, tensors whose shapes differ)
are stacked per key by :mod:`aenvs._extras`; a receive's sent entries are gathered by
:mod:`aenvs._gathering`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

from aenvs._action_errors import checked_leaf
from aenvs._buffers import Buffers
from aenvs._commands import Completion
from aenvs._extras import nest, put, stack_extras, to_td_value
from aenvs._gathering import SentInputs, gather_dense, numpy_view
from aenvs._layout import TIMED_OUT
from aenvs._object_actions import ObjectActions
from aenvs._rows import pick_rows, put_rows, row_items
from aenvs._specs import OBJECT, EnvSpec, Key, Leaf
from aenvs._tensors import (
    flat_entries,
    from_numpy,
    lazy_stack,
    maybe_dense_stack,
    root_entries,
    td_get,
    td_unchecked,
    td_update,
    torch_dtype,
)

__all__ = ["Batcher", "TimedOutStep"]

_ENV_INDEX = ("env_index",)


def _long(indices: Sequence[int]) -> torch.Tensor:
    """An int64 index tensor of ``indices``, through numpy: a third of what ``torch.tensor(list)`` costs."""
    return from_numpy(np.array(indices, dtype=np.int64))


@dataclass(frozen=True, slots=True)
class TimedOutStep:
    """The result of a step that a timeout ended as truncated (``on_timeout="truncate"``),
    carried as its Completion's ``value``: every fixed-shape entry under ``"next"`` (the
    env's last observation, reward 0, done and truncated True, terminated False), written
    over what the buffers hold, which the stopped step may have left half-written."""

    step: dict[Key, npt.NDArray[Any]]


class Batcher:
    """Moves batches between TensorDicts and a pool's buffers.

    Args:
        specs: one per env.
        buffers: the pool's buffers (numpy; viewed here as tensors, no copy).
        dense: stack every batch densely (requires one layout for every env).
        timed_out: give every step result a ``("next", "timed_out")`` flag (bool, ``[1]``),
            True for the steps a timeout ended (their Completion's value is a
            :class:`TimedOutStep`).
        copy: False: the step results (under ``"next"``) of a dense batch of every env in
            order are views of the step buffers (the pool's ``copy_results=False``).
    """

    def __init__(
        self,
        specs: Sequence[EnvSpec],
        buffers: Buffers,
        dense: bool,
        timed_out: bool = False,
        *,
        copy: bool = True,
    ) -> None:
        self.specs = specs
        self.dense = dense
        self.timed_out = timed_out
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
        self._no_extras: list[None] = [None] * len(specs)  # a batch of every env's plain answers
        # the members' own batch shape (TorchRL envs of batch size [3]): after the env dim in
        # every batch; the pool refuses members whose batch shapes differ
        self.batch_shape: tuple[int, ...] = specs[0].batch_shape if specs else ()
        # the dense path copies rows in numpy (aenvs._rows: holding the GIL): between the pool's
        # other work a torch op costs several times as much (9-13 us against 1.7 for 50 rows)
        first = buffers.groups[0]
        self._dense_plan = tuple(
            [(k, b, row_items(b)) for k, b in g.items()] for g in (first.reset, first.step)
        )
        # the same by root name, when no key is nested (the usual case): one dict built per batch
        self._flat_plan = tuple(
            [(k[0], b, items) for k, b, items in plan] if all(len(k) == 1 for k, _, _ in plan) else None
            for plan in self._dense_plan
        )
        self._arange_np = np.arange(len(specs), dtype=np.int64)
        # copy=False: each step buffer's tensor view, made once, nested as the batch is (a
        # timeout's truncated step writes into its batch: copies then)
        self._step_views: dict[str, Any] | None = None
        if not copy and not timed_out:
            self._step_views = {}
            for key, buf, _ in self._dense_plan[1]:
                put(self._step_views, key, from_numpy(buf))
        actions = [(k, a) for k, a in first.action.items() if a.dtype != OBJECT]
        self._dense_actions = [(k, self._groups[0][2][k], a, row_items(a)) for k, a in actions]
        self._sent_actions = {k: (a, items) for k, _, a, items in self._dense_actions}  # for receives

    # -- actions in ---------------------------------------------------------------

    def check_actions(self, td: TensorDictBase, env_indices: Sequence[int]) -> dict[Key, torch.Tensor] | None:
        """Raise ValueError naming the env and the key if ``td`` does not fit the action spaces.

        Returns, for a dense pool, the action tensors checked, by key (what
        :meth:`write_actions` copies); None for a lazy one."""
        if self.dense:
            return self._check_leaves(
                td,
                env_indices[0],
                self._tensor_actions[0],
                self._action_dtypes[0],
                1,
                others=len(env_indices) - 1,
            )
        for row, i in enumerate(env_indices):
            self._check_leaves(td[row], i, self._tensor_actions[i], self._action_dtypes[i], 0)
        return None

    def _check_leaves(
        self,
        td: TensorDictBase,
        env_index: int,
        leaves: Sequence[Leaf],
        dtypes: Mapping[Key, torch.dtype],
        batch_dims: int,
        others: int = 0,
    ) -> dict[Key, torch.Tensor]:
        checked: dict[Key, torch.Tensor] = {}
        root = root_entries(td) if type(td) is TensorDict else None
        for leaf in leaves:
            key = leaf.key
            # a root tensor read straight from a TensorDict's entries (tensordict's get costs more)
            value = root.get(key[0]) if root is not None and len(key) == 1 else None
            if type(value) is torch.Tensor and value.dtype is dtypes[key]:
                shape = value.shape
                if len(shape) == batch_dims + len(leaf.shape) and tuple(shape[batch_dims:]) == leaf.shape:
                    checked[key] = value
                    continue
            checked[key] = self._checked_leaf(td, env_index, leaf, dtypes, batch_dims, others)
        return checked

    def _checked_leaf(
        self,
        td: TensorDictBase,
        env_index: int,
        leaf: Leaf,
        dtypes: Mapping[Key, torch.dtype],
        batch_dims: int,
        others: int,
    ) -> torch.Tensor:
        """``td``'s entry for ``leaf``, or the error that names the env and the key."""
        who = f"env {env_index}" + (f" (and {others} more)" if others else "")
        space = self.specs[env_index].action_space
        return checked_leaf(td, who, space, leaf, dtypes[leaf.key], batch_dims)

    def write_actions(
        self,
        td: TensorDictBase,
        env_indices: Sequence[int],
        checked: Mapping[Key, torch.Tensor] | None = None,
    ) -> None:
        """Copy the checked actions of ``td`` into the envs' action rows (``checked``: what
        :meth:`check_actions` returned for it)."""
        if self.dense:
            assert checked is not None  # check_actions' values, for a dense pool
            self._write_dense(env_indices, checked)
            return
        for row, i in enumerate(env_indices):
            group, slot = self._location[i]
            env_td = td[row]
            for key, buf in self._groups[group][2].items():
                buf[slot] = env_td[key].detach()

    def root_actions(self, actions: Mapping[Any, Any]) -> dict[Key, torch.Tensor] | None:
        """``actions`` by name as :meth:`check_actions` returns them, when they are exactly a
        dense pool's action leaves as root tensors of every env; else None (the checks of a
        TensorDict of them name what is wrong)."""
        plain = self.dense and not self.batch_shape and not self.objects.present
        leaves = self._tensor_actions[0] if plain else ()
        if not leaves or len(actions) != len(leaves):
            return None
        dtypes, n = self._action_dtypes[0], len(self._all_rows)
        checked: dict[Key, torch.Tensor] = {}
        for leaf in leaves:
            key = leaf.key
            value = actions.get(key[0]) if len(key) == 1 else None
            if type(value) is not torch.Tensor or value.dtype is not dtypes[key]:
                return None
            shape = value.shape
            if len(shape) != 1 + len(leaf.shape) or shape[0] != n or tuple(shape[1:]) != leaf.shape:
                return None
            checked[key] = value
        return checked

    def write_checked(self, checked: Mapping[Key, torch.Tensor]) -> None:
        """Copy every env's actions, checked (:meth:`root_actions`), into their rows."""
        self._write_dense(self._all_rows, checked)

    def _write_dense(self, env_indices: Sequence[int], checked: Mapping[Key, torch.Tensor]) -> None:
        whole = env_indices == self._all_rows
        rows = None if whole else np.array(env_indices, dtype=np.int64)
        for key, buf, array, items in self._dense_actions:
            value = checked[key]
            if value.requires_grad:  # a policy's output: the env needs its value, not its graph
                value = value.detach()
            # numpy copies: a torch op releases the GIL, which a loop's thread may then wait
            # to get back behind every worker thread that wants it
            view = numpy_view(value)
            if whole:
                if view is not None:
                    array[...] = view
                else:
                    buf.copy_(value)
            elif view is not None:
                put_rows(array, cast("npt.NDArray[np.int64]", rows), view, items)
            else:
                buf[from_numpy(cast("npt.NDArray[np.int64]", rows))] = value

    # -- results out --------------------------------------------------------------

    def _dense_source(self, rows: npt.NDArray[np.int64] | None, which: int) -> dict[str, Any]:
        """Copies of the buffer ``rows`` (None: all, in order) as nested tensors (``which``
        0: reset buffers, 1: step buffers)."""
        if rows is None and which == 1 and self._step_views is not None:
            return _fresh_dicts(self._step_views)  # the caller may add entries to its dicts
        flat = self._flat_plan[which]
        if flat is not None:
            if rows is None:
                return {name: from_numpy(buf.copy()) for name, buf, _ in flat}
            return {name: from_numpy(pick_rows(buf, rows, items)) for name, buf, items in flat}
        source: dict[str, Any] = {}
        for key, buf, items in self._dense_plan[which]:
            put(source, key, from_numpy(buf.copy() if rows is None else pick_rows(buf, rows, items)))
        return source

    def _lazy_rows(self, env_indices: Sequence[int], which: int) -> LazyStackedTensorDict:
        per_env: list[TensorDictBase] = []
        for i in env_indices:
            group, row = self._location[i]
            entries = {k: b[row].clone() for k, b in self._groups[group][which].items()}
            per_env.append(TensorDict(entries, list(self.batch_shape)))
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
                    td_update(env_td, {k: to_td_value(v) for k, v in nest(env_extras).items()})
            if env_index is not None:
                td.set("env_index", env_index)
            return td
        # every entry was just copied out of a buffer with the batch's leading dim, so the
        # TensorDict constructor's checks are skipped (td_unchecked): they cost half a batch
        source = self._dense_source(rows, which)
        if not any(extras):  # the common case: built whole, without a TensorDict.set per key
            if env_index is not None:
                source["env_index"] = env_index
            return td_unchecked(source, torch.Size([len(env_indices), *self.batch_shape]))
        td = td_unchecked(source, torch.Size([len(env_indices), *self.batch_shape]))
        stack_extras(td, extras)
        if env_index is not None:
            td.set("env_index", env_index)
        return td

    def _inputs(self, inputs: SentInputs, env_rows: npt.NDArray[np.int64] | None) -> TensorDictBase:
        """The sent entries of a batch, whose envs may have been sent in different batches
        (``env_rows``: the batch's envs as buffer rows, None for every env in order). Its
        "env_index" may be left out: the batch sets its own."""
        if isinstance(inputs, TensorDictBase):  # sent in one batch, all its rows
            return inputs
        first = inputs[0][0]
        single = all(td is first for td, _ in inputs)
        if single:
            rows = [row for _, row in inputs]
            if rows == list(range(first.batch_size[0])):
                return first
        if self.dense or (single and flat_entries(first) is not None):
            # a dense pool's action rows hold what each env was sent: one copy per action key
            sent_actions = (self._sent_actions, env_rows) if self.dense else None
            gathered = gather_dense(inputs, sent_actions)
            if gathered is not None:
                return gathered
        if single:
            return first[_long([row for _, row in inputs])]
        parts: list[TensorDictBase] = [td[row] for td, row in inputs]
        return maybe_dense_stack(parts) if self.dense else lazy_stack(parts)

    def empty(self) -> TensorDictBase:
        """The result of a receive that found nothing (``min_get=0``)."""
        shape = [0, *self.batch_shape]
        return TensorDict({"env_index": torch.zeros(shape, dtype=torch.long)}, batch_size=shape)

    def _index(self, indices: list[int]) -> tuple[npt.NDArray[np.int64] | None, torch.Tensor]:
        """``indices`` as buffer rows (None: every env, in order) and as the "env_index" entry:
        ``[len(indices)]``, or with members of a batch shape, expanded to ``[len(indices),
        *batch_shape]`` (a TensorDict entry carries its batch's dims: each sub-env's row names
        its member)."""
        if indices == self._all_rows:
            rows, env_index = None, from_numpy(self._arange_np.copy())
        else:
            rows = np.array(indices, dtype=np.int64)
            env_index = from_numpy(rows)
        if self.batch_shape:
            shape = self.batch_shape
            env_index = env_index.reshape(-1, *(1 for _ in shape)).expand(-1, *shape).clone()
        return rows, env_index

    def reset_batch(self, completions: Sequence[Completion]) -> TensorDictBase:
        indices = [c.env_index for c in completions]
        rows, env_index = self._index(indices)
        return self._rows(indices, 0, [c.extras for c in completions], rows, env_index)

    def step_batch(self, completions: Sequence[Completion], inputs: SentInputs) -> TensorDictBase:
        """TorchRL's step layout: the sent entries at the root, the results under "next"."""
        indices = [c.env_index for c in completions]
        return self._step_batch(completions, inputs, indices, *self._index(indices))

    def step_whole(self, inputs: SentInputs) -> TensorDictBase:
        """:meth:`step_batch` of every env, in order, answered plainly (no extra entries)."""
        indices = self._all_rows
        return self._step_batch((), inputs, indices, *self._index(indices))

    def _step_batch(
        self,
        completions: Sequence[Completion],
        inputs: SentInputs,
        indices: list[int],
        rows: npt.NDArray[np.int64] | None,
        env_index: torch.Tensor,
    ) -> TensorDictBase:
        """``completions``: the envs' answers, or none when every env answered plainly."""
        extras = [c.extras for c in completions] if completions else self._no_extras
        nxt = self._rows(indices, 1, extras, rows)
        if self.timed_out:
            self._flag_timeouts(nxt, completions)
        sent = self._inputs(inputs, rows)
        if self.dense:
            root = root_entries(sent)
            batch = torch.Size([len(indices), *self.batch_shape])
            return td_unchecked({**root, "next": nxt, "env_index": env_index}, batch)
        out = sent.copy() if hasattr(sent, "tensordicts") else lazy_stack(list(sent.unbind(0)))
        out.set("next", nxt)
        out.set("env_index", env_index)
        return out

    def _flag_timeouts(self, nxt: TensorDictBase, completions: Sequence[Completion]) -> None:
        """Set ``nxt``'s "timed_out" flags, and the entries of the steps a timeout ended."""
        flags = np.zeros((nxt.batch_size[0], *self.batch_shape, 1), dtype=bool)
        for row, c in enumerate(completions):
            ended = c.value
            if not isinstance(ended, TimedOutStep):
                continue
            flags[row] = True
            target = nxt if self.dense else cast(LazyStackedTensorDict, nxt).tensordicts[row]
            for key, value in ended.step.items():
                entry = td_get(target, key)
                if isinstance(entry, torch.Tensor):
                    if self.dense:
                        entry[row] = from_numpy(value)
                    else:
                        entry.copy_(from_numpy(value))
        nxt.set(TIMED_OUT, from_numpy(flags))

    def step_columns(self, completions: Sequence[Completion]) -> dict[Key, Any] | None:
        """The results of ``completions`` (steps) as columns, without a TensorDict: per leaf
        of ``"next"``, a numpy array of the rows (fixed-shape entries) or a list of values
        (text and other plain values); ``("env_index",)`` the envs. None where the batch is
        not that simple (a lazy pool, members with a batch shape, extra entries that are
        not plain values): build it with :meth:`step_batch` then."""
        if not self.dense or self.batch_shape:
            return None
        return self._columns(completions, 1, self._column_rows(completions) if completions else None)

    def step_and_reset_columns(
        self, completions: Sequence[Completion]
    ) -> tuple[dict[Key, Any], dict[Key, Any]] | None:
        """:meth:`step_columns` of step-and-resets, and the next step's input as columns (the
        reset rows: where an episode ended, its reset observation); None as there."""
        if not self.dense or self.batch_shape:
            return None
        rows = self._column_rows(completions) if completions else None
        step = self._columns(completions, 1, rows)
        following = None if step is None else self._columns(completions, 0, rows)
        return None if step is None or following is None else (step, following)

    def _column_rows(self, completions: Sequence[Completion]) -> npt.NDArray[np.int64] | None:
        """The envs of ``completions`` as buffer rows (None: every env, in order)."""
        indices = [c.env_index for c in completions]
        return None if indices == self._all_rows else np.array(indices, dtype=np.int64)

    def _columns(
        self,
        completions: Sequence[Completion],
        which: int,
        rows: npt.NDArray[np.int64] | None,
    ) -> dict[Key, Any] | None:
        """:meth:`step_columns` (``which`` 1) or the reset rows (0) of ``completions``, whose
        envs are the buffer ``rows`` (None: every env, in order); no completions: every env,
        answered plainly."""
        columns: dict[Key, Any] = {
            key: buf.copy() if rows is None else pick_rows(buf, rows, items)
            for key, buf, items in self._dense_plan[which]
        }
        step = which == 1
        extras = [
            None if e is None else _flat(e)
            for e in (c.extras if step else c.reset_extras for c in completions)
        ]
        if any(extras):
            keys = {key for e in extras if e for key in e}
            for key in keys:
                values = [None if e is None else e.get(key) for e in extras]
                if not all(type(v) in _PLAIN for v in values):
                    return None
                columns[key] = values
        if step and self.timed_out:
            flags = np.zeros((len(self._all_rows) if rows is None else len(rows), 1), dtype=bool)
            for row, c in enumerate(completions):
                ended = c.value
                if isinstance(ended, TimedOutStep):
                    flags[row] = True
                    for key, value in ended.step.items():
                        column = columns.get(key)
                        if isinstance(column, np.ndarray | list):
                            column[row] = value
            columns[TIMED_OUT_KEY] = flags
        columns[_ENV_INDEX] = self._arange_np.copy() if rows is None else rows.copy()
        return columns

    def step_and_reset_whole(self, inputs: SentInputs) -> tuple[TensorDictBase, TensorDictBase]:
        """:meth:`step_and_reset_batch` of every env, in order, answered plainly."""
        return self.step_and_reset_batch((), inputs)

    def step_and_reset_batch(
        self, completions: Sequence[Completion], inputs: SentInputs
    ) -> tuple[TensorDictBase, TensorDictBase]:
        """``step_batch``, and the next step's input: reset observations where an episode
        ended (no ``completions``: every env, in order, answered plainly)."""
        indices = [c.env_index for c in completions] if completions else self._all_rows
        rows, env_index = self._index(indices)
        out = self._step_batch(completions, inputs, indices, rows, env_index)
        # its own env_index: the caller may write into one of the two
        if self.batch_shape:
            second_index = env_index.clone()
        else:
            second_index = from_numpy((self._arange_np if rows is None else rows).copy())
        reset_extras = [c.reset_extras for c in completions] if completions else self._no_extras
        nxt = self._rows(indices, 0, reset_extras, rows, second_index)
        return out, nxt


_PLAIN = frozenset({str, bytes, int, float, bool, type(None)})


def _fresh_dicts(tree: dict[str, Any]) -> dict[str, Any]:
    """``tree`` with new dicts and the same leaves."""
    return {k: _fresh_dicts(v) if type(v) is dict else v for k, v in tree.items()}  # pyright: ignore[reportUnknownArgumentType]


def _flat(extras: Mapping[Key, Any]) -> dict[Key, Any]:
    """``extras`` with nested dicts (an info dict) spread into longer keys."""
    if not any(type(v) is dict for v in extras.values()):
        return dict(extras)
    flat: dict[Key, Any] = {}
    for key, value in extras.items():
        if type(value) is dict:
            for sub, inner in _flat({(k,): v for k, v in cast("dict[str, Any]", value).items()}).items():
                flat[(*key, *sub)] = inner
        else:
            flat[key] = value
    return flat


TIMED_OUT_KEY: Key = (TIMED_OUT,)
