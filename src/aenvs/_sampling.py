"""Random actions from gymnasium action spaces, laid out as the pool reads actions."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import torch
from gymnasium import spaces
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

from aenvs._specs import Key, Space
from aenvs._tensors import non_tensor_stack, torch_dtype

__all__ = ["random_actions"]


def _sample(space: Space, n: int, generator: torch.Generator | None) -> Any:
    """``n`` samples of ``space`` stacked on a first dim: a tensor, a dict for Dict / Tuple,
    a non-tensor stack for spaces without a fixed shape."""
    if isinstance(space, spaces.Dict):
        return {k: _sample(sub, n, generator) for k, sub in cast("spaces.Dict[Any]", space).spaces.items()}
    if isinstance(space, spaces.Tuple):
        subspaces = cast("spaces.Tuple[Any]", space).spaces
        return {str(i): _sample(sub, n, generator) for i, sub in enumerate(subspaces)}
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        return torch.randint(start, start + int(space.n), (n,), generator=generator)
    if isinstance(space, spaces.MultiDiscrete):
        space = cast("spaces.MultiDiscrete[Any]", space)
        nvec = torch.as_tensor(np.asarray(space.nvec), dtype=torch.float64)
        start = torch.as_tensor(np.asarray(space.start), dtype=torch.int64)
        u = torch.rand((n, *nvec.shape), generator=generator, dtype=torch.float64)
        return (u * nvec).floor().to(torch.int64) + start
    if isinstance(space, spaces.MultiBinary):
        return torch.randint(0, 2, (n, *space.shape), generator=generator).to(torch.int8)
    if isinstance(space, spaces.Box):
        space = cast("spaces.Box[Any]", space)
        dtype = torch_dtype(space.dtype)
        shape = (n, *space.shape)
        if dtype == torch.bool:
            return torch.randint(0, 2, shape, generator=generator).bool()
        low = torch.as_tensor(np.asarray(space.low, dtype=np.float64))
        high = torch.as_tensor(np.asarray(space.high, dtype=np.float64))
        u = torch.rand(shape, generator=generator, dtype=torch.float64)
        if not dtype.is_floating_point:
            return (low + (u * (high - low + 1)).floor()).clamp(low, high).to(dtype)
        bounded = torch.isfinite(low) & torch.isfinite(high)
        normal = torch.randn(shape, generator=generator, dtype=torch.float64)
        value = torch.where(bounded, low + u * (high - low), normal)
        value = torch.where(torch.isfinite(low) & ~bounded, low + normal.abs(), value)
        value = torch.where(torch.isfinite(high) & ~bounded, high - normal.abs(), value)
        return value.to(dtype)
    # no fixed shape (Text, Sequence, Graph, OneOf, custom): the space's own sampler, on a
    # copy seeded from ``generator`` (the env's space keeps its random state)
    sampler = copy.deepcopy(space)
    sampler.seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
    return non_tensor_stack([sampler.sample() for _ in range(n)])


def _at(root: Key, value: Any) -> dict[str, Any]:
    """``value`` placed at ``root`` (``()``: ``value`` is already a dict of entries)."""
    for part in reversed(root):
        value = {part: value}
    return cast("dict[str, Any]", value)


def random_actions(
    action_spaces: Sequence[Space],
    *,
    dense: bool = True,
    generator: torch.Generator | None = None,
    roots: Sequence[Key] | None = None,
) -> TensorDictBase:
    """One random action per env, laid out as the pool reads actions: under ``"action"``, or
    per env where ``roots`` says (an env spec's ``action_root``: ``()`` for a multi-agent env,
    whose groups hold their own ``"action"``).

    ``dense``: every env has the same action space (one draw for the batch); else the
    actions are drawn per env and stacked lazily.

    Example:
        >>> td = random_actions([spaces.Discrete(2)] * 3)
        >>> td["action"].shape, td["action"].dtype
        (torch.Size([3]), torch.int64)
        >>> group = spaces.Dict({"team": spaces.Dict({"action": spaces.MultiBinary(2)})})
        >>> random_actions([group] * 3, roots=[()] * 3)["team", "action"].shape
        torch.Size([3, 2])
    """
    roots = roots if roots is not None else [("action",)] * len(action_spaces)
    if dense:
        n = len(action_spaces)
        return TensorDict(_at(roots[0], _sample(action_spaces[0], n, generator)), batch_size=[n])
    rows = [
        TensorDict(_at(root, _sample(space, 1, generator)), batch_size=[1])[0]
        for space, root in zip(action_spaces, roots, strict=True)
    ]
    return LazyStackedTensorDict.lazy_stack(rows)
