"""Random actions for a pool's envs, each from its own action space (``aenvs run``'s policy)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np
from gymnasium import spaces

from aenvs._specs import EnvSpec, Space, flatten_value

if TYPE_CHECKING:
    import torch
    from tensordict import TensorDictBase

__all__ = ["RandomActions"]


class RandomActions:
    """Samples actions for some envs of a pool, each from its own action space.

    On a dense pool, Discrete and finite float Box spaces are sampled with one torch
    call per group of envs sharing a space; other spaces (and every lazy pool) fall
    back to ``space.sample()`` per env, stacked densely or lazily as the pool stacks.

    Args:
        specs: one per env (``pool.env_specs``).
        dense: whether the pool stacks densely (``pool.is_dense``).
        seed: seeds the torch generator and the (copied) action spaces.

    Example:
        >>> from gymnasium import spaces
        >>> specs = [EnvSpec.from_spaces(spaces.Box(-1, 1, (2,)), spaces.Discrete(3, start=10))] * 2
        >>> sampler = RandomActions(specs, dense=True, seed=0)
        >>> actions = sampler([1, 0, 1])["action"]  # for envs 1, 0 and 1
        >>> actions.shape, all(10 <= a < 13 for a in actions.tolist())
        (torch.Size([3]), True)
    """

    def __init__(self, specs: Sequence[EnvSpec], *, dense: bool, seed: int | None = None) -> None:
        import torch

        self._specs = list(specs)
        self._dense = dense
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)
        # copies: the specs may hold the envs' own space objects, which we must not reseed
        self._spaces = [copy.deepcopy(s.action_space) for s in self._specs]
        for i, space in enumerate(self._spaces):
            space.seed(None if seed is None else seed + i)
        self._groups: list[Space] = []
        self._group_of: list[int] = []
        for space in self._spaces:
            for g, known in enumerate(self._groups):
                if type(known) is type(space) and known == space:
                    self._group_of.append(g)
                    break
            else:
                self._groups.append(space)
                self._group_of.append(len(self._groups) - 1)
        self.vectorised = dense and all(_vectorisable(space) for space in self._groups)

    def __call__(self, env_index: torch.Tensor | Sequence[int]) -> TensorDictBase:
        """A batch ``[len(env_index)]`` holding ``"action"`` (and nested action keys) for those envs."""
        import torch
        from tensordict import TensorDict

        from aenvs._tensors import lazy_stack, tensor_tolist

        indices = torch.as_tensor(env_index, dtype=torch.long).reshape(-1)
        if self.vectorised:
            return TensorDict({"action": self._sample_vectorised(indices)}, batch_size=[len(indices)])
        tds = [self._sample_one(i) for i in tensor_tolist(indices)]
        if self._dense:
            return torch.stack(tds)  # pyright: ignore[reportReturnType, reportArgumentType]
        return lazy_stack(tds)

    def fill(self, td: TensorDictBase) -> TensorDictBase:
        """Set random actions into ``td`` for the envs of its ``"env_index"``; return ``td``."""
        if self.vectorised:  # the hot path: one tensor, no intermediate TensorDict
            td.set("action", self._sample_vectorised(td["env_index"]))
        else:
            td.update(self(td["env_index"]))  # pyright: ignore[reportUnknownMemberType]
        return td

    def _sample_vectorised(self, indices: torch.Tensor) -> torch.Tensor:
        import torch

        from aenvs._tensors import tensor_tolist

        if len(self._groups) == 1:
            return self._sample_space(self._groups[0], len(indices))
        groups = torch.as_tensor(self._group_of)[indices]
        first = self._sample_space(self._groups[int(groups[0])], len(indices))
        out = torch.empty_like(first)
        counts: list[int] = tensor_tolist(torch.bincount(groups, minlength=len(self._groups)))
        for g, count in enumerate(counts):
            if count:
                out[groups == g] = self._sample_space(self._groups[g], count)
        return out

    def _sample_space(self, space: Space, k: int) -> torch.Tensor:
        import torch

        from aenvs._tensors import torch_dtype

        if isinstance(space, spaces.Discrete):
            start, n = int(space.start), int(space.n)
            return torch.randint(start, start + n, (k,), generator=self._generator, dtype=torch.long)
        assert isinstance(space, spaces.Box)
        space = cast("spaces.Box[Any]", space)
        dtype = torch_dtype(space.dtype)
        shape = (k, *space.shape)
        low, high = np.asarray(space.low), np.asarray(space.high)
        lo, hi = float(low.min()), float(high.max())
        if (low == lo).all() and (high == hi).all():  # scalar bounds
            return torch.empty(shape, dtype=dtype).uniform_(lo, hi, generator=self._generator)
        low_t = torch.as_tensor(low, dtype=dtype)
        span = torch.as_tensor(high, dtype=dtype) - low_t
        return low_t + span * torch.rand(shape, dtype=dtype, generator=self._generator)

    def _sample_one(self, i: int) -> TensorDictBase:
        import torch
        from tensordict import TensorDict

        from aenvs._tensors import torch_dtype

        space, spec = self._spaces[i], self._specs[i]
        dtypes = {leaf.key: torch_dtype(leaf.dtype) for leaf in spec.action_leaves if not leaf.is_object}
        objects = {leaf.key for leaf in spec.action_leaves if leaf.is_object}
        td = TensorDict({}, batch_size=[])
        for key, value in flatten_value(space, space.sample(), spec.action_root):
            if key in dtypes:
                td.set(key, torch.as_tensor(np.asarray(value), dtype=dtypes[key]))
            elif key in objects:  # text, token lists...: as sampled
                td.set_non_tensor(key, value)
        return td


def _vectorisable(space: Space) -> bool:
    if isinstance(space, spaces.Discrete):
        return True
    if not isinstance(space, spaces.Box):
        return False
    space = cast("spaces.Box[Any]", space)
    if not np.issubdtype(space.dtype, np.floating):
        return False
    with np.errstate(over="ignore", invalid="ignore"):
        return bool(np.isfinite(space.high - space.low).all())  # finite bounds and a finite span
