"""The errors a batch of actions gets when an entry does not fit its env's action space."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from aenvs._specs import Key, Leaf
from aenvs._tensors import td_get

__all__ = ["checked_leaf"]


def checked_leaf(
    td: TensorDictBase, who: str, space: Any, leaf: Leaf, dtype: torch.dtype, batch_dims: int
) -> torch.Tensor:
    """``td``'s entry for ``leaf`` if it fits (a tensor of ``dtype``, of the leaf's shape
    after ``batch_dims`` dims), or the error that names ``who`` (the envs) and the key.

    Example:
        >>> from tensordict import TensorDict
        >>> leaf = Leaf(("action",), (), torch.int64)
        >>> checked_leaf(TensorDict({}, [2]), "env 0", "Discrete(2)", leaf, torch.int64, 1)
        Traceback (most recent call last):
        ...
        ValueError: env 0: the input has no 'action' entry; its action space is Discrete(2)
    """
    name = _name(leaf.key)
    value = td_get(td, leaf.key)
    if value is None:
        raise ValueError(f"{who}: the input has no {name!r} entry; its action space is {space}")
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{who}: {name!r} must be a tensor, got {type(value).__name__}")
    shape = tuple(value.shape[batch_dims:])
    if shape != leaf.shape:
        raise ValueError(
            f"{who}: {name!r} has shape {shape} per env, expected {leaf.shape} for the action space {space}"
        )
    if value.dtype != dtype:
        raise ValueError(
            f"{who}: {name!r} has dtype {value.dtype}, expected {dtype} for the action space {space}"
        )
    return value


def _name(key: Key) -> str:
    return ".".join(key)
