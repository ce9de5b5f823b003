"""Partial steps (``"_step"``) and partial resets (``"_reset"``), as pure functions on TensorDicts.

These are TorchRL's batched-env semantics (``shared/reference/partial-resets.md``);
the pool's whole-batch ``reset``, ``step`` and ``step_and_maybe_reset`` call them, so
the sync shim and async users get the same behaviour.

- ``"_step"`` (bool, ``[B]``): only those rows are stepped; the ``"next"`` entries of the
  other rows are their input value of the same key (the previous observation, done
  flags...), or 0 where the input has no such key.
- ``"_reset"`` (bool, shaped like ``"done"``: ``[B, 1]``, ``[B]`` accepted) beside a
  ``"done"``: only those rows (or, for a nested ``"_reset"``, those rows of that group)
  take the reset values; elsewhere the output keeps the input values. Input entries
  the reset does not give are zeroed where the reset applies (the reset did not keep
  them). A root ``"_reset"`` overrides nested ones. Levels without a ``"_reset"`` follow
  the level above: for a row that is reset because of one group, entries outside every
  group come from the reset.
- ``"_step"`` / ``"_reset"`` never appear in outputs.

Dense TensorDicts are merged with one indexing operation per leaf; lazy stacks
(envs with different layouts) row by row.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import torch
from tensordict import LazyStackedTensorDict, NonTensorData, NonTensorStack, TensorDict, TensorDictBase
from tensordict.utils import NestedKey

from aenvs._ragged import is_ragged, stack_ragged
from aenvs._specs import Leaf
from aenvs._tensors import (
    lazy_stack,
    non_tensor_rows,
    non_tensor_stack,
    td_clone,
    td_get,
    td_keys,
    tensor_tolist,
    torch_dtype,
)

__all__ = [
    "RESET_KEY",
    "STEP_KEY",
    "ResetPlan",
    "done_rows",
    "fill_rows",
    "has_reset_mask",
    "merge_reset",
    "merge_step",
    "plan_reset",
    "step_mask",
    "strip_masks",
    "zeros",
]

RESET_KEY = "_reset"
STEP_KEY = "_step"
_MASKS = (RESET_KEY, STEP_KEY)
_DONE_NAMES = ("done", "terminated", "truncated")

Key = tuple[str, ...]


def _key(key: NestedKey) -> Key:
    return (key,) if isinstance(key, str) else cast("Key", tuple(key))


def _name(key: Key) -> str:
    return ".".join(key)


def _is_leaf(cls: type) -> bool:
    """Leaves for our purposes: tensors and non-tensor data (not sub-TensorDicts)."""
    return not issubclass(cls, TensorDictBase) or issubclass(cls, NonTensorData | NonTensorStack)


def _leaves(td: TensorDictBase) -> list[Key]:
    return [_key(k) for k in td_keys(td, nested=True, leaves=True, is_leaf=_is_leaf)]


def _row(td: TensorDictBase, index: int) -> TensorDictBase:
    return td[index]


def _is_lazy(td: TensorDictBase) -> bool:
    return isinstance(td, LazyStackedTensorDict) and not isinstance(td, NonTensorStack)


def _mask_keys(td: TensorDictBase, names: Collection[str] = _MASKS) -> list[Key]:
    return [k for k in map(_key, td_keys(td, nested=True)) if k[-1] in names]


def has_reset_mask(td: TensorDictBase) -> bool:
    """Whether ``td`` holds a ``"_reset"`` entry at the root or nested.

    Example:
        >>> has_reset_mask(TensorDict({"a": {"_reset": torch.ones(2, 1, dtype=torch.bool)}}, [2]))
        True
    """
    return bool(_mask_keys(td, (RESET_KEY,)))


def strip_masks(td: TensorDictBase) -> TensorDictBase:
    """``td`` without its ``"_step"`` / ``"_reset"`` entries (a shallow copy when it had any).

    Example:
        >>> td = TensorDict({"x": torch.zeros(2), "_step": torch.ones(2, dtype=torch.bool)}, [2])
        >>> list(strip_masks(td).keys())
        ['x']
    """
    keys = _mask_keys(td)
    return td.exclude(*keys) if keys else td


def _mask(td: TensorDictBase, key: Key, batch: int) -> torch.Tensor:
    """The mask at ``key`` as a bool tensor of shape ``[batch]`` (any over trailing dims)."""
    value = td_get(td, key)
    if not isinstance(value, torch.Tensor) or value.dtype != torch.bool:
        kind = value.dtype if isinstance(value, torch.Tensor) else type(value).__name__
        raise TypeError(f"{_name(key)!r} must be a bool tensor, got {kind}")
    if value.dim() == 0 or value.shape[0] != batch:
        raise ValueError(
            f"{_name(key)!r} has shape {tuple(value.shape)}; its first dim must be the batch ({batch})"
        )
    return value.reshape(batch, -1).any(-1)


def step_mask(td: TensorDictBase) -> torch.Tensor | None:
    """The ``"_step"`` entry of ``td`` as a bool tensor ``[B]`` (``[B, 1]`` accepted), or None.

    Example:
        >>> step_mask(TensorDict({"_step": torch.tensor([[True], [False]])}, [2])).tolist()
        [True, False]
    """
    if STEP_KEY not in td_keys(td):
        return None
    return _mask(td, (STEP_KEY,), td.batch_size[0])


def done_rows(td: TensorDictBase) -> torch.Tensor:
    """Rows of ``td`` where any done / terminated / truncated entry (root or nested) is set.

    Example:
        >>> td = TensorDict({"done": torch.tensor([[False], [True]])}, [2])
        >>> done_rows(td).tolist()
        [False, True]
    """
    batch = td.batch_size[0]
    done = torch.zeros(batch, dtype=torch.bool)
    for key in map(_key, td_keys(td, nested=True, leaves=True)):
        if key[-1] in _DONE_NAMES and key[0] != "next":
            value = td_get(td, key)
            if isinstance(value, torch.Tensor) and value.dtype == torch.bool:
                done |= value.reshape(batch, -1).any(-1)
    return done


def zeros(layouts: Sequence[Sequence[Leaf]], *, dense: bool) -> TensorDictBase:
    """Zeros with one row per layout (its leaves' keys, shapes and dtypes): ``[len(layouts)]``.

    Example:
        >>> import numpy as np
        >>> leaf = Leaf(("observation",), (3,), np.dtype("float32"))
        >>> zeros([[leaf], [leaf]], dense=True)["observation"].shape
        torch.Size([2, 3])
    """
    if dense:
        batch = len(layouts)
        source = {
            leaf.key: torch.zeros((batch, *leaf.shape), dtype=torch_dtype(leaf.dtype)) for leaf in layouts[0]
        }
        return TensorDict(source, batch_size=[batch])
    rows = [
        TensorDict({leaf.key: torch.zeros(leaf.shape, dtype=torch_dtype(leaf.dtype)) for leaf in layout}, [])
        for layout in layouts
    ]
    return lazy_stack(rows)


# -- partial resets ---------------------------------------------------------------------


@dataclass(frozen=True)
class ResetPlan:
    """What a partial reset does, row by row of its input.

    Attributes:
        rows: input rows whose env is reset (any of its masks is set).
        groups: per nested level with a ``"_reset"`` (the key of its parent), the rows
            where that group takes the reset values; None when a root ``"_reset"`` decides.
        options: per row of ``rows``, the reset options telling the env which groups to
            reset (``{"_reset": {"agent0": {"_reset": array([True])}, ...}}``), or None.
    """

    rows: list[int]
    groups: dict[Key, torch.Tensor] | None = None
    options: list[dict[str, Any] | None] = field(default_factory=list[dict[str, Any] | None])


def _nested_options(td: TensorDictBase, keys: Sequence[Key], row: int) -> dict[str, Any]:
    """The nested ``"_reset"`` masks of one row as plain dicts of numpy arrays."""
    tree: dict[str, Any] = {}
    for key in keys:
        node = tree
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = td_get(td, key)[row].numpy(force=True).copy()
    return tree


def plan_reset(td: TensorDictBase, done_keys: Collection[Key]) -> ResetPlan:
    """Read the ``"_reset"`` entries of ``td`` (batch ``[B]``) into a :class:`ResetPlan`.

    ``done_keys``: the ``"done"`` keys the envs have; a nested ``"_reset"`` must sit beside
    one of them (or beside a ``"done"`` of ``td``).

    Example:
        >>> td = TensorDict({"_reset": torch.tensor([[False], [True]])}, [2])
        >>> plan_reset(td, {("done",)}).rows
        [1]
    """
    batch = td.batch_size[0]
    keys = _mask_keys(td, (RESET_KEY,))
    if (RESET_KEY,) in keys:
        root = _mask(td, (RESET_KEY,), batch)
        return ResetPlan(tensor_tolist(root.nonzero().flatten()))
    present = {k for k in map(_key, td_keys(td, nested=True)) if k[-1] == "done"}
    groups: dict[Key, torch.Tensor] = {}
    for key in keys:
        level = key[:-1]
        if (*level, "done") not in done_keys and (*level, "done") not in present:
            raise ValueError(
                f"{_name(key)!r} has no 'done' beside it: a '_reset' must be paired with a 'done' "
                "at the same level"
            )
        groups[level] = _mask(td, key, batch)
    if not groups:
        return ResetPlan(list(range(batch)))
    any_group = torch.stack(list(groups.values())).any(0)
    rows: list[int] = tensor_tolist(any_group.nonzero().flatten())
    options: list[dict[str, Any] | None] = [{RESET_KEY: _nested_options(td, keys, r)} for r in rows]
    return ResetPlan(rows, groups, options)


def _level(key: Key, groups: dict[Key, torch.Tensor] | None) -> Key | None:
    """The deepest group level ``key`` lies under, or None (it follows the row's reset)."""
    if not groups:
        return None
    best: Key | None = None
    for level in groups:
        if len(key) > len(level) and key[: len(level)] == level and (best is None or len(level) > len(best)):
            best = level
    return best


def _place(old: Any, new: Any, rows: torch.Tensor, batch: int, key: Key) -> Any:
    """A ``[batch]`` entry: ``new`` (``[len(rows)]``) at ``rows``, ``old`` elsewhere (0 where absent).

    Rows whose shapes differ (a variable-length entry: the input's rows one length, the
    envs' another) are merged row by row and stacked as :func:`~aenvs._ragged.stack_ragged`
    stacks them."""
    if isinstance(new, torch.Tensor):
        out: torch.Tensor | None = None
        if isinstance(old, torch.Tensor):
            if old.shape[1:] == new.shape[1:]:
                out = old.to(new.dtype, copy=True)
        elif not isinstance(old, NonTensorStack):
            out = new.new_zeros((batch, *new.shape[1:]))
        if out is not None:
            out[rows] = new
            return out
    values = _rows_of(old, batch)
    for row, value in zip(tensor_tolist(rows), _rows_of(new, len(rows)), strict=True):
        values[row] = value
    if values and all(isinstance(v, torch.Tensor) for v in values):
        tensors = cast("list[torch.Tensor]", values)
        return stack_ragged(tensors) if is_ragged(tensors) else torch.stack(tensors)
    return non_tensor_stack(values)


def _rows_of(value: Any, batch: int) -> list[Any]:
    """Per-row values of an entry: a tensor's rows, a non-tensor entry's python values."""
    if isinstance(value, torch.Tensor):
        return list(value.unbind(0))
    return non_tensor_rows(value, batch)


def _zero_rows(old: Any, rows: torch.Tensor, batch: int) -> Any:
    if isinstance(old, torch.Tensor):
        out = old.clone()
        out[rows] = 0
        return out
    values = non_tensor_rows(old, batch)
    for row in tensor_tolist(rows):
        values[row] = None
    return non_tensor_stack(values)


def merge_reset(
    previous: TensorDictBase,
    reset: TensorDictBase,
    plan: ResetPlan,
    env_index: torch.Tensor,
) -> TensorDictBase:
    """The output of a partial reset: ``reset`` (the reset rows, in ``plan.rows`` order)
    merged into ``previous`` (the input, masks stripped), as ``plan`` says.

    Example (the root-only case of partial-resets.md):
        >>> previous = TensorDict({"val": torch.tensor([[1.0], [1.0]])}, [2])
        >>> reset = TensorDict({"val": torch.zeros(1, 1)}, [1])
        >>> out = merge_reset(previous, reset, ResetPlan([1]), torch.arange(2))
        >>> out["val"].flatten().tolist()
        [1.0, 0.0]
    """
    batch = previous.batch_size[0]
    if _is_lazy(previous) or _is_lazy(reset):
        return _merge_reset_rows(previous, reset, plan, env_index)
    out = previous.copy()
    rows = torch.as_tensor(plan.rows, dtype=torch.long)
    groups = plan.groups
    given: set[Key] = set()
    for key in _leaves(reset):
        if key == ("env_index",):
            continue
        given.add(key)
        level = _level(key, groups)
        new = td_get(reset, key)
        target = rows
        if level is not None:
            assert groups is not None
            take = groups[level][rows]
            target, new = rows[take], new[take]
        out.set(key, _place(td_get(previous, key), new, target, batch, key))
    if groups is None and len(plan.rows) == batch:
        out.set("env_index", env_index)
        return out  # a reset of every env keeps the other input entries, as TorchRL's
    for key in _leaves(previous):
        if key in given or key == ("env_index",):
            continue
        level = _level(key, groups)
        target = rows
        if level is not None:
            assert groups is not None
            target = rows[groups[level][rows]]
        if len(target):
            out.set(key, _zero_rows(td_get(previous, key), target, batch))
    out.set("env_index", env_index)
    return out


def _merge_reset_rows(
    previous: TensorDictBase, reset: TensorDictBase, plan: ResetPlan, env_index: torch.Tensor
) -> TensorDictBase:
    position = {row: j for j, row in enumerate(plan.rows)}
    groups = plan.groups
    rows: list[TensorDictBase] = []
    for r in range(previous.batch_size[0]):
        row = _row(previous, r).copy()
        j = position.get(r)
        if j is not None:
            new = _row(reset, j)

            def applies(key: Key, r: int = r) -> bool:
                level = _level(key, groups)
                return level is None or bool(groups is not None and groups[level][r])

            given = {k for k in _leaves(new) if k != ("env_index",)}
            for key in given:
                if applies(key):
                    row.set(key, td_get(new, key))
            whole = groups is None and len(plan.rows) == previous.batch_size[0]
            for key in [] if whole else _leaves(_row(previous, r)):
                if key not in given and key != ("env_index",) and applies(key):
                    value = td_get(row, key)
                    if isinstance(value, torch.Tensor):
                        row.set(key, torch.zeros_like(value))
                    else:
                        row = row.exclude(key)
        row.set("env_index", env_index[r])
        rows.append(row)
    return lazy_stack(rows)


# -- partial steps ----------------------------------------------------------------------


def merge_step(
    previous: TensorDictBase,
    stepped: TensorDictBase,
    rows: Sequence[int],
    template: TensorDictBase,
    env_index: torch.Tensor,
) -> TensorDictBase:
    """The output of a partial step.

    Args:
        previous: the step's input (masks stripped), batch ``[B]``.
        stepped: the step output of the stepped rows (in ``rows`` order), TorchRL layout.
        rows: the rows of ``previous`` that were stepped.
        template: zeros with the full ``"next"`` layout of every row, batch ``[B]``.
        env_index: the env index of each row.

    Returns:
        ``previous`` at the root, and under ``"next"`` the step results at ``rows`` and,
        for the other rows, the input value of the same key (0 where absent).

    Example:
        >>> previous = TensorDict({"observation": torch.tensor([[1.0], [2.0]])}, [2])
        >>> stepped = TensorDict({"observation": torch.tensor([[1.0]]),
        ...                       "next": {"observation": torch.tensor([[5.0]])}}, [1])
        >>> template = TensorDict({"observation": torch.zeros(2, 1)}, [2])
        >>> out = merge_step(previous, stepped, [0], template, torch.arange(2))
        >>> out["next", "observation"].flatten().tolist()
        [5.0, 2.0]
    """
    if _is_lazy(previous) or _is_lazy(stepped) or _is_lazy(template):
        return _merge_step_rows(previous, stepped, rows, template, env_index)
    nxt = fill_rows(previous, stepped["next"] if len(rows) else template[:0], rows, template)
    out = previous.copy()
    out.set("next", nxt)
    out.set("env_index", env_index)
    return out


def fill_rows(
    base: TensorDictBase,
    new: TensorDictBase,
    rows: Sequence[int],
    template: TensorDictBase | None = None,
) -> TensorDictBase:
    """A ``[B]`` TensorDict with the keys of ``new`` (and ``template``): ``new``'s values at
    ``rows``, elsewhere ``base``'s value of the same key, or the template's (0) where absent.

    Example:
        >>> base = TensorDict({"x": torch.tensor([1.0, 2.0, 3.0])}, [3])
        >>> fill_rows(base, TensorDict({"x": torch.tensor([9.0])}, [1]), [1])["x"].tolist()
        [1.0, 9.0, 3.0]
    """
    batch = base.batch_size[0]
    if _is_lazy(base) or _is_lazy(new) or (template is not None and _is_lazy(template)):
        return _fill_rows_lazy(base, new, rows, template)
    index = torch.as_tensor(list(rows), dtype=torch.long)
    out = TensorDict({}, batch_size=[batch])
    given = _leaves(new)
    for key in given:
        old = td_get(base, key)
        if old is None and template is not None:
            old = td_get(template, key)
        out.set(key, _place(old, td_get(new, key), index, batch, key))
    if template is not None:
        for key in _leaves(template):
            if key not in given:
                zeros, old = td_get(template, key), td_get(base, key)
                out.set(key, zeros.clone() if old is None else _place(old, zeros[:0], index[:0], batch, key))
    return out


def _fill_rows_lazy(
    base: TensorDictBase, new: TensorDictBase, rows: Sequence[int], template: TensorDictBase | None
) -> TensorDictBase:
    position = {row: j for j, row in enumerate(rows)}
    out: list[TensorDictBase] = []
    for r in range(base.batch_size[0]):
        j = position.get(r)
        if j is not None:
            out.append(_row(new, j).copy())
            continue
        if template is None:
            raise ValueError("a partial batch of envs with different layouts needs a template")
        row = td_clone(_row(template, r))
        previous = _row(base, r)
        for key in _leaves(row):
            old = td_get(previous, key)
            if isinstance(old, torch.Tensor) and old.shape == td_get(row, key).shape:
                row.set(key, old.to(td_get(row, key).dtype, copy=True))
        out.append(row)
    return lazy_stack(out)


def _merge_step_rows(
    previous: TensorDictBase,
    stepped: TensorDictBase,
    rows: Sequence[int],
    template: TensorDictBase,
    env_index: torch.Tensor,
) -> TensorDictBase:
    nxt = _fill_rows_lazy(previous, stepped["next"] if len(rows) else template[:0], rows, template)
    out_rows: list[TensorDictBase] = []
    for r in range(previous.batch_size[0]):
        row = _row(previous, r).copy()
        row.set("next", _row(nxt, r))
        row.set("env_index", env_index[r])
        out_rows.append(row)
    return lazy_stack(out_rows)
