"""Gymnasium envs as pool members: building them from ids or factories, and stepping them.

Everything here is numpy-only, so worker processes hosting gymnasium envs need no
torch. The parent turns the numpy data into tensors.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from aenvs.env import Env, EnvContext
from aenvs.scalars import reward_value
from aenvs.specs import EnvSpec, Key, action_reader, flatten_value, observation_root

__all__ = ["EnvFn", "GymAdapter", "Outcome", "build_env", "make_adapter"]

EnvFn = Callable[..., Any] | str
"""An env factory: a gymnasium id, or a callable returning a gymnasium or aenvs env,
optionally taking an :class:`~aenvs.EnvContext`."""


class Outcome(NamedTuple):
    """One env's reset or step result, normalised: entries plus the step scalars."""

    items: list[tuple[Key, Any]]
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: Mapping[str, Any] | None = None


# per factory: a pool of N envs usually repeats one factory N times, and inspect.signature
# costs more than building a small env (35 of the 44 ms a pool of 256 native envs took to start)
_TAKES_CONTEXT: weakref.WeakKeyDictionary[Callable[..., Any], bool] = weakref.WeakKeyDictionary()


def _takes_context(fn: Callable[..., Any]) -> bool:
    try:
        return _TAKES_CONTEXT[fn]
    except (KeyError, TypeError):  # TypeError: not hashable, or not weakly referenceable
        pass
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins, some C callables
        return False
    required = [
        p for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    takes = len(required) == 1
    try:
        _TAKES_CONTEXT[fn] = takes
    except TypeError:
        pass
    return takes


def build_env(env_fn: EnvFn, context: EnvContext, make_kwargs: Mapping[str, Any] | None = None) -> Any:
    """Build one env from a gymnasium id or a factory (given ``context`` if it takes one).

    Example:
        >>> env = build_env("CartPole-v1", EnvContext(0, 0, 1))
        >>> env.spec.id
        'CartPole-v1'
    """
    if isinstance(env_fn, str):
        return gym.make(env_fn, **(make_kwargs or {}))
    if not callable(env_fn):
        raise TypeError(
            f"env {context.env_index}: env_fns entries must be gymnasium ids or callables, "
            f"got {type(env_fn).__name__}"
        )
    env = env_fn(context) if _takes_context(env_fn) else env_fn()
    if isinstance(env, str):
        return gym.make(env, **(make_kwargs or {}))
    return env


class GymAdapter:
    """Runs a ``gymnasium.Env`` and lays its results out as :mod:`aenvs.specs` says."""

    is_async = False

    def __init__(self, env: gym.Env) -> None:
        self.env = env
        self.spec = EnvSpec.from_spaces(env.observation_space, env.action_space)
        self._obs_space = env.observation_space
        self._obs_root = observation_root(self._obs_space)
        self._flat_obs = isinstance(self._obs_space, gym.spaces.Box | gym.spaces.Discrete)
        self._action_space = env.action_space
        self._actions: Mapping[Key, np.ndarray] | None = None
        self._read_action: Callable[[int], Any] = lambda row: None

    def _items(self, obs: Any) -> list[tuple[Key, Any]]:
        if self._flat_obs:
            return [(self._obs_root, obs)]
        return list(flatten_value(self._obs_space, obs, self._obs_root))

    def outcome(self, out: Any, step: bool) -> Outcome:  # pragma: no cover - gymnasium envs are never async
        raise TypeError("gymnasium envs return their results directly")

    def reset(self, seed: int | None, options: Mapping[str, Any] | None) -> Outcome:
        obs, info = self.env.reset(seed=seed, options=dict(options) if options else None)
        return Outcome(self._items(obs), info=info)

    def step(self, actions: Mapping[Key, np.ndarray], row: int) -> Outcome:
        if self._actions is not actions:  # first step: compile the reader for these buffers
            self._read_action = action_reader(self._action_space, actions)
            self._actions = actions
        obs, reward, terminated, truncated, info = self.env.step(self._read_action(row))
        return Outcome(self._items(obs), reward_value(reward), bool(terminated), bool(truncated), info)

    def seed(self, seed: int | None) -> None:
        self.env.reset(seed=seed)
        self.env.action_space.seed(seed)

    def get_attr(self, name: str) -> Any:
        return self.env.get_wrapper_attr(name)

    def set_attr(self, name: str, value: Any) -> None:
        self.env.set_wrapper_attr(name, value)

    def close(self) -> None:
        self.env.close()


def make_adapter(env: Any) -> Any:
    """Wrap a built env in the adapter that runs it (gymnasium, native aenvs or TorchRL)."""
    if isinstance(env, Env):
        from aenvs.native import NativeAdapter  # torch is needed only for native envs

        return NativeAdapter(env)
    if isinstance(env, gym.Env):
        return GymAdapter(env)
    if hasattr(env, "full_observation_spec") and hasattr(env, "full_action_spec"):  # a TorchRL env
        from aenvs.torchrl import TorchRLAdapter

        return TorchRLAdapter(env)
    raise TypeError(
        f"an env factory returned {type(env).__name__}; expected a gymnasium.Env, "
        "an aenvs.Env, a TorchRL env or a gymnasium id string"
    )
