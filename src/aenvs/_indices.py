"""Env indices as callers give them: read, checked, and refused with an error naming the argument."""

from __future__ import annotations

import operator
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch

__all__ = ["read_env_index"]

_FORMS = "an int, a sequence of ints, an integer tensor or array, or a boolean mask of length {n}"


def read_env_index(value: Any, num_envs: int, name: str = "env_index") -> list[int]:
    """The env indices ``value`` stands for, in its order (range and duplicates are the pool's to check).

    Accepted: a Python or numpy int, a sequence of those, an integer tensor or numpy array
    (any shape, read in order), or a boolean mask (tensor or numpy array) of shape
    ``[num_envs]`` selecting the envs where it is True. Floats, bools and anything else
    raise TypeError naming ``name``.

    Example:
        >>> read_env_index(torch.tensor([True, False, True]), 3)
        [0, 2]
        >>> read_env_index([1.5], 3)
        Traceback (most recent call last):
        ...
        TypeError: env_index[0] is 1.5 (float): env indices are integers
    """
    if type(value) is torch.Tensor and value.dtype is torch.int64 and value.dim() == 1:
        return value.tolist()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType] - the usual form
    plain = _plain_ints(value)
    if plain is not None:
        return plain
    if isinstance(value, torch.Tensor):
        if value.dtype is torch.bool:
            return _mask(value.numpy(force=True), value.shape, num_envs, name)
        if value.is_floating_point() or value.is_complex():
            raise TypeError(
                f"{name} is a {value.dtype} tensor: env indices are integers ({_forms(num_envs)})"
            )
        return value.reshape(-1).tolist()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    if isinstance(value, np.ndarray):
        array = cast("npt.NDArray[Any]", value)
        if array.dtype.kind == "b":
            return _mask(array, array.shape, num_envs, name)
        if array.dtype.kind not in "iu":
            raise TypeError(
                f"{name} is an array of {array.dtype}: env indices are integers ({_forms(num_envs)})"
            )
        return array.reshape(-1).tolist()
    if isinstance(value, bool | np.bool_):
        raise TypeError(
            f"{name} is {value!r}: env indices are integers ({_forms(num_envs)}; "
            "a list of bools is not read as a mask, a bool tensor is)"
        )
    if isinstance(value, int | np.integer):
        return [int(cast("int | np.integer[Any]", value))]
    if isinstance(value, str | bytes) or not hasattr(value, "__iter__"):
        raise TypeError(f"{name} is {value!r} ({type(value).__name__}): expected {_forms(num_envs)}")
    indices: list[int] = []
    for k, item in enumerate(value):
        if type(item) is int:
            indices.append(item)
            continue
        if not isinstance(item, bool | np.bool_):
            try:
                indices.append(operator.index(item))
                continue
            except TypeError:
                pass
        raise TypeError(
            f"{name}[{k}] is {item!r} ({type(cast(object, item)).__name__}): env indices are integers"
        )
    return indices


def _plain_ints(value: Any) -> list[int] | None:
    """A copy of ``value`` if it is a list of Python ints (the other usual form, read in one
    pass), else None."""
    if type(value) is not list:
        return None
    items = cast("list[Any]", value)
    return list(items) if all(type(item) is int for item in items) else None


def _mask(mask: npt.NDArray[Any], shape: Any, num_envs: int, name: str) -> list[int]:
    if tuple(shape) != (num_envs,):
        raise ValueError(
            f"{name} is a boolean mask of shape {tuple(shape)}; a mask selects envs and needs shape ({num_envs},)"
        )
    return np.flatnonzero(mask).tolist()


def _forms(num_envs: int) -> str:
    return _FORMS.format(n=num_envs)
