"""An env's step scalars (reward, flags) read as the pool stores them, with errors that name them."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["reward_value"]

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def reward_value(value: Any) -> float:
    """``value`` as the float a reward is stored as (float32), or an error naming the reward.

    A number, or a numpy or torch value holding exactly one (shape ``()``, or ``(1,)`` as
    TorchRL lays rewards out). A finite reward beyond float32's range is refused
    rather than stored as inf.

    Example:
        >>> reward_value(np.array([0.5]))
        0.5
        >>> reward_value(1e300)
        Traceback (most recent call last):
        ...
        ValueError: the env returned a reward of 1e+300, beyond float32's range (the reward's dtype): it would be stored as inf
    """
    if type(value) is float or type(value) is int:
        reward = float(value)
    else:
        shape = getattr(value, "shape", None)
        if shape is not None and math.prod(shape) != 1:
            raise ValueError(f"the env returned a reward of shape {tuple(shape)}: a reward is one number")
        try:
            reward = float(value.item() if shape is not None else value)
        except (TypeError, ValueError) as exc:
            raise TypeError(
                f"the env returned a reward of type {type(value).__name__} ({value!r}): a reward is one number"
            ) from exc
    if (reward > _FLOAT32_MAX or reward < -_FLOAT32_MAX) and not math.isinf(reward):
        raise ValueError(
            f"the env returned a reward of {reward!r}, beyond float32's range (the reward's dtype): "
            "it would be stored as inf"
        )
    return reward
