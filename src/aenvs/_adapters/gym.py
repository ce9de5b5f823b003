"""Gymnasium envs as pool members: stepping them and laying out their results.

Everything here is numpy-only, so worker processes hosting gymnasium envs need no
torch. The parent turns the numpy data into tensors.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, cast

import gymnasium as gym
import numpy as np

from aenvs._adapters.gym_async import is_coroutine_env, lifted
from aenvs._adapters.outcome import Outcome
from aenvs._scalars import reward_value
from aenvs._specs import EnvSpec, Key, action_reader, observation_root, value_flattener

__all__ = ["GymAdapter"]


class GymAdapter:
    """Runs a ``gymnasium.Env`` and lays its results out as :mod:`aenvs._specs` says.

    A coroutine env (a layer of which has an ``async def`` step or reset) is ``is_async``:
    its ``step`` and ``reset`` return awaitables, which the runner awaits and lays out with
    :meth:`outcome`; the wrappers around it run as :func:`lifted` says.
    """

    def __init__(self, env: gym.Env[Any, Any]) -> None:
        self.env = env
        self.spec = EnvSpec.from_spaces(env.observation_space, env.action_space)
        self._obs_space = env.observation_space
        self._obs_root = observation_root(self._obs_space)
        self._flat_obs = isinstance(self._obs_space, gym.spaces.Box | gym.spaces.Discrete)
        self._flatten = value_flattener(self._obs_space, self._obs_root)
        self._action_space = env.action_space
        self._actions: Mapping[Key, np.ndarray] | None = None
        self._read_action: Callable[[int], Any] = lambda row: None
        self.is_async = is_coroutine_env(env)
        # built once: raises here (the env's "make") if a wrapper cannot run around a coroutine env
        self._async_step = lifted(env, "step") if self.is_async else None
        self._async_reset = lifted(env, "reset") if self.is_async else None
        #: where a plain env's array observation goes (its one entry): the runner then steps
        #: it in its own loop and writes the observation itself; None otherwise
        self.array_observation: Key | None = None
        if not self.is_async and isinstance(self._obs_space, gym.spaces.Box):
            self.array_observation = self._obs_root

    def _items(self, obs: Any) -> list[tuple[Key, Any]]:
        if self._flat_obs:
            return [(self._obs_root, obs)]
        return self._flatten(obs)

    def outcome(self, out: Any, step: bool) -> Outcome:
        """Lay out what a coroutine env's step (``step=True``) or reset returned, once awaited."""
        if step:
            obs, reward, terminated, truncated, info = out
            return Outcome(self._items(obs), reward_value(reward), bool(terminated), bool(truncated), info)
        obs, info = out
        return Outcome(self._items(obs), info=info)

    def reset(self, seed: int | None, options: Mapping[str, Any] | None) -> Any:
        """An Outcome, or for a coroutine env an awaitable of ``(obs, info)``."""
        options = dict(options) if options else None
        if self._async_reset is not None:
            return self._async_reset(seed=seed, options=options)
        out = self.env.reset(seed=seed, options=options)
        try:
            obs, info = out
        except TypeError:
            raise _not_a_result(self.env, "reset", out) from None
        return Outcome(self._items(obs), info=info)

    def action_reader(self, actions: Mapping[Key, np.ndarray]) -> Callable[[int], Any]:
        """A function reading the action of a row of ``actions`` as the env's space expects it."""
        if self._actions is not actions:  # compiled once for these buffers
            self._read_action = action_reader(self._action_space, actions)
            self._actions = actions
        return self._read_action

    def step(self, actions: Mapping[Key, np.ndarray], row: int) -> Any:
        """An Outcome, or for a coroutine env an awaitable of the 5-tuple of ``env.step``."""
        action = self.action_reader(actions)(row)
        if self._async_step is not None:
            return self._async_step(action)
        obs, reward, terminated, truncated, info = self.step_tuple(self.env.step(action))
        return Outcome(self._items(obs), reward_value(reward), bool(terminated), bool(truncated), info)

    def step_tuple(self, out: Any) -> tuple[Any, Any, Any, Any, Any]:
        """What a plain env's ``env.step`` returned, as its 5-tuple, or the error that says
        what it returned instead."""
        if type(out) is tuple and len(out) == 5:  # pyright: ignore[reportUnknownArgumentType]
            return cast("tuple[Any, Any, Any, Any, Any]", out)
        try:
            obs, reward, terminated, truncated, info = cast(Any, out)
        except TypeError:
            raise _not_a_result(self.env, "step", out) from None
        return obs, reward, terminated, truncated, info

    def seed(self, seed: int | None) -> Any:
        if self._async_reset is not None:
            return self._seed_async(seed)
        self.env.reset(seed=seed)
        self.env.action_space.seed(seed)

    async def _seed_async(self, seed: int | None) -> None:
        assert self._async_reset is not None
        await self._async_reset(seed=seed, options=None)
        self.env.action_space.seed(seed)

    def get_attr(self, name: str) -> Any:
        return self.env.get_wrapper_attr(name)

    def set_attr(self, name: str, value: Any) -> None:
        self.env.set_wrapper_attr(name, value)

    def close(self) -> Any:
        return self.env.close()


def _not_a_result(env: gym.Env[Any, Any], name: str, out: Any) -> Exception:
    """The error for a step or reset result that cannot be unpacked: a clear one if it is a
    coroutine that a method not declared ``async def`` returned."""
    if not inspect.isawaitable(out):
        return TypeError(f"{type(env.unwrapped).__name__}.{name} returned {type(out).__name__}, not a tuple")
    if inspect.iscoroutine(out):
        out.close()  # never awaited: no "never awaited" warning on top of this error
    return TypeError(
        f"{type(env.unwrapped).__name__}.{name} returned a coroutine, but is not a coroutine function: "
        "declare it `async def` so that aenvs awaits it (and runs the env concurrently with others)"
    )
