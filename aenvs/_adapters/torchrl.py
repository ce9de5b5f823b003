"""A TorchRL env (an ``EnvBase`` of batch size ``[]``) as a pool member, in any executor."""

# pyright: reportMissingImports=false
# (torchrl is an optional extra that the main dev venv lacks; .venv-torchrl's tests run this module)

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDictBase
from torchrl.data import Composite, MultiOneHot, OneHot
from torchrl.envs import EnvBase
from torchrl.envs.utils import step_mdp

# TorchRL's own gymnasium <-> TorchRL spec conversions (what its GymWrapper uses): private
# names, so they are imported in this one place
from torchrl.envs.libs.gym import (  # isort: skip
    _gym_to_torchrl_spec_transform as _space_to_spec,
    _torchrl_to_gym_spec_transform as _spec_to_space,
)

from aenvs._adapters.outcome import Outcome
from aenvs._specs import EnvSpec, Key

__all__ = ["TorchRLAdapter", "spec_of"]


# -- a TorchRL env in a pool ---------------------------------------------------------------


def _space(spec: Any) -> spaces.Space:
    """A TorchRL spec as a gymnasium space, its one-hot leaves as index spaces."""
    if isinstance(spec, OneHot | MultiOneHot):
        spec = spec.to_categorical_spec()
    elif isinstance(spec, Composite):
        spec = spec.clone()
        for key, leaf in list(spec.items(include_nested=True, leaves_only=True)):
            if isinstance(leaf, OneHot | MultiOneHot):
                spec[key] = leaf.to_categorical_spec()
    return _spec_to_space(spec, categorical_action_encoding=True)


class TorchRLAdapter:
    """Runs a TorchRL env (batch size ``[]``) as a pool member, as :class:`~aenvs._adapters.gym.GymAdapter`
    runs a gymnasium env.

    Its observation entries (``full_observation_spec``) are the observation keys, its
    action entries (``full_action_spec``) the action keys; a one-hot action is sent as an
    index (a ``Discrete`` space, as for gymnasium envs) and one-hot encoded here. Between
    steps the adapter keeps the env's last output (TorchRL's ``step_mdp``), so envs that
    read their state from the input TensorDict work too.

    Example:
        >>> import asyncio
        >>> from torchrl.envs import GymEnv
        >>> from aenvs import AsyncEnvPool
        >>> async def main():  # the pool runs each TorchRL env in a TorchRLAdapter
        ...     async with AsyncEnvPool([lambda: GymEnv("CartPole-v1")] * 4, executor="thread") as pool:
        ...         return (await pool.reset())["observation"].shape
        >>> asyncio.run(main())
        torch.Size([4, 4])
    """

    is_async = False

    def __init__(self, env: EnvBase) -> None:
        if tuple(env.batch_size):
            raise ValueError(
                f"a TorchRL env in a pool must have batch size [] (one env per slot), got "
                f"{list(env.batch_size)}: give the pool one factory per env instead"
            )
        self.env = env
        action_specs = {
            _as_key(key): leaf
            for key, leaf in env.full_action_spec.items(include_nested=True, leaves_only=True)
        }
        if list(action_specs) == [("action",)]:  # the usual single action: a space, not a Dict
            action_space = _space(action_specs[("action",)])
            env_keys = {("action",): ("action",)}
        else:  # several action entries: nested under "action" in the pool, where they are in the env
            action_space = _space(env.full_action_spec)
            env_keys = {("action", *key): key for key in action_specs}
        self.spec = EnvSpec.from_spaces(_space(env.full_observation_spec), action_space)
        self._observation_keys = list(self.spec.observation_keys)
        # per action leaf of the pool: the env's key, and the one-hot spec that encodes it if any
        self._actions = [
            (key, env_key, _categorical(action_specs[env_key])) for key, env_key in env_keys.items()
        ]
        self._td: TensorDictBase | None = None

    def outcome(self, out: Any, step: bool) -> Outcome:  # pragma: no cover - TorchRL envs are never async
        raise TypeError("TorchRL envs return their results directly")

    def _items(self, td: TensorDictBase) -> list[tuple[Key, Any]]:
        return [(key, td.get(key).numpy()) for key in self._observation_keys]

    def reset(self, seed: int | None, options: Mapping[str, Any] | None) -> Outcome:
        if options:
            raise ValueError(f"TorchRL envs take no reset options, got {sorted(options)}")
        if seed is not None:
            self.env.set_seed(seed)
        self._td = self.env.reset()
        return Outcome(self._items(self._td))

    def step(self, actions: Mapping[Key, np.ndarray], row: int) -> Outcome:
        td = self._td
        if td is None:
            raise RuntimeError("step before the first reset")
        for key, env_key, one_hot in self._actions:
            value = torch.tensor(actions[key][row])  # a copy: the row is overwritten by the next send
            if one_hot is not None:
                categorical, dtype = one_hot
                value = categorical.to_one_hot(value).to(dtype)
            td.set(env_key, value)
        out = self.env.step(td)
        nxt = out.get("next")
        terminated, truncated = _episode_end(nxt)
        self._td = step_mdp(out, keep_other=True)
        return Outcome(self._items(nxt), float(nxt.get("reward")), terminated, truncated)

    def seed(self, seed: int | None) -> None:
        self.env.set_seed(seed)

    def get_attr(self, name: str) -> Any:
        return getattr(self.env, name)

    def set_attr(self, name: str, value: Any) -> None:
        setattr(self.env, name, value)

    def close(self) -> None:
        self.env.close()


def _episode_end(nxt: TensorDictBase) -> tuple[bool, bool]:
    """``(terminated, truncated)`` of a TorchRL step's ``"next"``, by TorchRL's rule: the
    episode ends when any of ``"done"``, ``"terminated"``, ``"truncated"`` is set.

    A ``"done"`` that neither flag explains (an env whose done spec has only ``"done"``, or
    ``StepCounter(truncated_key="done")``) counts as terminated, as TorchRL fills a missing
    ``"terminated"`` from ``"done"`` (``EnvBase._complete_done``).
    """
    flags = [nxt.get(key, None) for key in ("done", "terminated", "truncated")]
    done, terminated, truncated = (bool(flag.any()) if flag is not None else False for flag in flags)
    return terminated or (done and not truncated), truncated


def _as_key(key: str | tuple[str, ...]) -> Key:
    return (key,) if isinstance(key, str) else tuple(key)


def _categorical(spec: Any) -> tuple[Any, torch.dtype] | None:
    """For a one-hot spec: its categorical twin (which encodes indices) and its dtype."""
    if isinstance(spec, OneHot | MultiOneHot):
        return spec.to_categorical_spec(), spec.dtype
    return None


def spec_of(space: spaces.Space) -> Any:
    """A gymnasium space as a TorchRL spec (discrete spaces as categorical, not one-hot)."""
    return _space_to_spec(space, categorical_action_encoding=True)
