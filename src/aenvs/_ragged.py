"""One entry across envs whose tensors differ in shape (token ids, point clouds, a varying
number of objects): stacked lazily at the entry's own key, never padded, never refused.

The form: a lazy stack of the envs' tensors (tensordict's ``NonTensorStack``: a
``LazyStackedTensorDict`` with one row per env, each row that env's tensor as it came,
torch dtype and shape kept). The batch's other entries stay dense tensors; a lazy pool
holds each env's tensor in that env's own TensorDict, so nothing here is needed there.

Why not a jagged nested tensor (``torch.nested.as_nested_tensor(rows, layout=torch.jagged)``),
although it costs less to build and is what a policy wants (``benchmarks/ragged.py`` measures
both; docs/performance.md has the figures): a TensorDict holds one, but it does not survive
what the pool does to batches. A receive of part of a sent batch gathers its rows with
numpy (``.numpy()`` refuses nested tensors) or tensor indexing (``aten.index.Tensor`` is
not implemented for them); a ``"_step"`` / ``"_reset"`` mask merges the input's rows into
the output, which needs equal shapes per row; tensordict 0.14 (TorchRL 0.14's pin) cannot
index its rows (``td[idx]``, ``td[1:]``); and a rollout's stack over time would need a
second ragged dim. A policy turns the lazy form into a jagged tensor with one call
(:func:`as_jagged`, for 8-512 envs cheaper than a padded copy).

Example:
    >>> import torch
    >>> rows = [torch.arange(3), torch.arange(5)]
    >>> stacked = stack_ragged(rows)
    >>> [t.tolist() for t in stacked.tolist()]
    [[0, 1, 2], [0, 1, 2, 3, 4]]
    >>> as_jagged(stacked.tolist()).shape[0]
    2
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import NonTensorStack

__all__ = ["as_jagged", "is_ragged", "stack_ragged"]


def is_ragged(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether ``tensors`` (one per env) share a dtype and a number of dims but not a shape.

    Example:
        >>> is_ragged([torch.zeros(2), torch.zeros(3)])
        True
        >>> is_ragged([torch.zeros(2), torch.zeros(2)]), is_ragged([torch.zeros(2), torch.zeros(1, 2)])
        (False, False)
    """
    first = tensors[0]
    same_kind = all(t.dtype == first.dtype and t.ndim == first.ndim for t in tensors)
    return same_kind and any(t.shape != first.shape for t in tensors)


def stack_ragged(tensors: Sequence[torch.Tensor]) -> NonTensorStack:
    """The envs' tensors as one entry of batch ``[len(tensors)]``: a lazy stack whose row
    ``i`` is ``tensors[i]`` itself (not copied, not padded).

    Example:
        >>> stacked = stack_ragged([torch.zeros(2, 3), torch.ones(4, 3)])
        >>> stacked.batch_size, [tuple(t.shape) for t in stacked.tolist()]
        (torch.Size([2]), [(2, 3), (4, 3)])
    """
    rows: list[Any] = list(tensors)
    return NonTensorStack.from_list(rows)  # pyright: ignore[reportUnknownMemberType]


def as_jagged(rows: Sequence[torch.Tensor]) -> torch.Tensor | None:
    """The rows as a jagged nested tensor ``[N, j, ...]`` (one copy), or None where a jagged
    tensor cannot hold them: it has one ragged dim, so rows must differ in their first dim
    only (point clouds ``[k_i, 3]`` can be; grids ``[k_i, m_i]`` cannot), and have one.

    Example:
        >>> nested = as_jagged([torch.arange(3), torch.arange(5)])
        >>> nested.offsets().tolist(), nested.values().tolist()
        ([0, 3, 8], [0, 1, 2, 0, 1, 2, 3, 4])
        >>> as_jagged([torch.zeros(1, 2), torch.zeros(2, 3)]) is None
        True
    """
    first = rows[0]
    if first.ndim == 0 or any(t.ndim != first.ndim or t.shape[1:] != first.shape[1:] for t in rows):
        return None
    return torch.nested.as_nested_tensor(list(rows), layout=torch.jagged)  # pyright: ignore[reportUnknownMemberType]
