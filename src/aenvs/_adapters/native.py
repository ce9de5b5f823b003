"""Native aenvs envs (TensorDicts in and out, plain or ``async def``) as pool members.

A native env's ``step`` gets a TensorDict holding its action entries and returns a
TensorDict (or a plain mapping, which is cheaper to build) with its observation
entries, ``"reward"`` and ``"terminated"`` (``"truncated"`` optional). Entries the
observation space does not name are passed through as extras.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from types import CoroutineType
from typing import Any, cast

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from aenvs._adapters.outcome import Outcome
from aenvs._env import Env
from aenvs._scalars import reward_value
from aenvs._specs import EnvSpec, Key
from aenvs._tensors import from_numpy, non_tensor_data

__all__ = ["NativeAdapter"]

_SCALARS = frozenset({"reward", "terminated", "truncated", "done"})


def _lookup(out: Any, key: Key) -> Any:
    for part in key:
        out = out[part]
    return out


def _as_array(value: Any) -> Any:
    if type(value) is np.ndarray:  # the common case, before the costlier isinstance on torch.Tensor
        return value
    return value.numpy(force=True) if isinstance(value, torch.Tensor) else value


class NativeAdapter:
    """Runs an :class:`aenvs.Env`; ``is_async`` when its ``step`` is a coroutine function."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.spec = EnvSpec.from_spaces(env.observation_space, env.action_space, env.reward_space)
        self.is_async = inspect.iscoroutinefunction(env.step)
        self._obs_keys = self.spec.observation_keys
        self._flat_obs = all(len(key) == 1 for key in self._obs_keys)
        self._single_obs = self._obs_keys[0] if len(self._obs_keys) == 1 and self._flat_obs else None
        #: the name of the one observation entry, if the env has one at its root: a step
        #: returning a plain dict of it and the scalars is written without ``outcome``
        self.plain_observation = None if self._single_obs is None else self._single_obs[0]
        #: the root entries a step may return that are not extras
        self.known_roots = frozenset(key[0] for key in self._obs_keys) | _SCALARS
        self._action_keys = [leaf.key for leaf in self.spec.action_leaves if not leaf.is_object]
        #: non-tensor actions (text, token lists...): set as non-tensor entries each step
        self._object_keys = [leaf.key for leaf in self.spec.action_leaves if leaf.is_object]
        self._actions: Mapping[Key, np.ndarray] | None = None
        self._action_views: list[tuple[Key, torch.Tensor]] = []
        self._action_container: TensorDictBase = TensorDict()
        self._action_slots: dict[str, Any] | None = None

    def outcome(self, out: Any, step: bool) -> Outcome:
        """Normalise what the env's reset (``step=False``) or step returned."""
        # a plain dict is the cheap case on a hot path: no isinstance against ABCs, no walk of its keys
        plain = type(out) is dict
        if not plain and not isinstance(out, TensorDictBase | Mapping):
            raise TypeError(f"a native env returned {type(out).__name__}, expected a TensorDict or a mapping")
        out = cast("Mapping[str, Any]", out)  # a TensorDict is read as one: keys, [] and `in`
        keys = out.keys()
        single = self._single_obs
        if single is not None:  # one observation entry at the root: no loop
            value = out[single[0]]
            items: list[tuple[Key, Any]] = [
                (single, value if type(value) is np.ndarray else _as_array(value))
            ]
        elif self._flat_obs:
            items = [(key, _as_array(out[key[0]])) for key in self._obs_keys]
        else:
            items = [(key, _as_array(_lookup(out, key))) for key in self._obs_keys]
        if not (plain and keys <= self.known_roots):
            for root in keys:
                if root not in self.known_roots:  # entries the spec does not name travel as extras
                    value = out[root]
                    items.append(
                        ((root,), value.to_dict() if isinstance(value, TensorDictBase) else _as_array(value))
                    )
        if not step:
            return Outcome(items)
        if "reward" not in keys or "terminated" not in keys:
            raise KeyError("a native env's step must return 'reward' and 'terminated'")
        truncated = bool(out["truncated"]) if "truncated" in keys else False
        return Outcome(items, reward_value(out["reward"]), bool(out["terminated"]), truncated, None)

    # reset and step return an Outcome, or the env's awaitable whose result goes through
    # outcome() once awaited (the runner does that: one coroutine less per step)
    def reset(self, seed: int | None, options: Mapping[str, Any] | None) -> Any:
        out = self.env.reset(seed=seed, options=dict(options) if options else None)
        return out if inspect.isawaitable(out) else self.outcome(out, False)

    def _action_td(self, actions: Mapping[Key, np.ndarray], row: int) -> TensorDictBase:
        """The TensorDict a step gets: tensors viewing this env's action rows, in a container
        reused step after step, as TorchRL's workers hand their envs shared buffers. Nothing is
        allocated per step: building a TensorDict costs more than a fast env's step, and objects
        made per step and kept across an env's latency set off the costliest garbage collections.
        The rows only change when the next step is sent, after this one has finished."""
        if self._actions is not actions:  # first step (or new buffers): tensors over the rows
            self._actions = actions
            self._action_views = [
                (key, from_numpy(actions[key][row : row + 1].reshape(actions[key].shape[1:])))
                for key in self._action_keys
            ]
            self._action_container = TensorDict()
            flat = all(len(key) == 1 for key in (*self._action_keys, *self._object_keys))
            self._action_slots = getattr(self._action_container, "_tensordict", None) if flat else None
        td, slots = self._action_container, self._action_slots
        if slots is None:  # nested action keys (or a tensordict without the raw dict): the public way
            td = TensorDict()
            for key, tensor in self._action_views:
                td.set(key, tensor)
        else:
            for key, tensor in self._action_views:  # put back what an env may have replaced or removed
                slots[key[0]] = tensor
        if slots is None:
            for key in self._object_keys:
                td.set_non_tensor(key, actions[key][row])
        else:
            for key in self._object_keys:
                slots[key[0]] = non_tensor_data(actions[key][row])
        return td

    def step(self, actions: Mapping[Key, np.ndarray], row: int) -> Any:
        """The env's step result: a plain dict as returned (the runner writes the common one
        itself), an awaitable, or anything else through ``outcome``."""
        out = self.env.step(self._action_td(actions, row))
        kind = type(out)
        if kind is dict or kind is CoroutineType or inspect.isawaitable(out):
            return out
        return self.outcome(out, True)

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
