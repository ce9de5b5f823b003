"""Native aenvs envs (TensorDicts in and out, plain or ``async def``) as pool members."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenvs.env import Env
from aenvs.gym import Outcome
from aenvs.specs import EnvSpec, Key

__all__ = ["NativeAdapter"]

_SCALARS = {("reward",), ("terminated",), ("truncated",), ("done",)}


def _outcome(td: TensorDictBase, *, step: bool) -> Outcome:
    if not isinstance(td, TensorDictBase):
        raise TypeError(f"native env returned {type(td).__name__}, expected a TensorDict")
    items: list[tuple[Key, Any]] = []
    for key, value in td.items(include_nested=True, leaves_only=True):
        key = (key,) if isinstance(key, str) else tuple(key)
        if key not in _SCALARS:
            items.append((key, value.numpy(force=True) if isinstance(value, torch.Tensor) else value))
    if not step:
        return Outcome(items)
    if "reward" not in td.keys() or "terminated" not in td.keys():
        raise KeyError("a native env's step must return 'reward' and 'terminated'")
    terminated = bool(td["terminated"].any())
    truncated = bool(td["truncated"].any()) if "truncated" in td.keys() else False
    return Outcome(items, float(td["reward"].sum()), terminated, truncated)


class NativeAdapter:
    """Runs an :class:`aenvs.Env`; ``is_async`` when its ``step`` is a coroutine function."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.spec = EnvSpec.from_spaces(env.observation_space, env.action_space, env.reward_space)
        self.is_async = inspect.iscoroutinefunction(env.step)
        self._action_keys = [leaf.key for leaf in self.spec.action_leaves]

    async def _await(self, pending: Awaitable[TensorDictBase], step: bool) -> Outcome:
        return _outcome(await pending, step=step)

    def reset(self, seed: int | None, options: Mapping[str, Any] | None) -> Any:
        out = self.env.reset(seed=seed, options=dict(options) if options else None)
        return self._await(out, False) if inspect.isawaitable(out) else _outcome(out, step=False)

    def step(self, actions: Mapping[Key, np.ndarray], row: int) -> Any:
        td = TensorDict({key: torch.tensor(actions[key][row]) for key in self._action_keys})
        out = self.env.step(td)
        return self._await(out, True) if inspect.isawaitable(out) else _outcome(out, step=True)

    def seed(self, seed: int | None) -> Any:
        set_seed = getattr(self.env, "set_seed", None)
        if callable(set_seed):
            return set_seed(seed)
        return self.env.reset(seed=seed)

    def get_attr(self, name: str) -> Any:
        return getattr(self.env, name)

    def set_attr(self, name: str, value: Any) -> None:
        setattr(self.env, name, value)

    def close(self) -> Any:
        return self.env.close()
