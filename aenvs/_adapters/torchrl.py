"""A TorchRL env (an ``EnvBase`` of batch size ``[]``) as a pool member, in any executor."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy.typing as npt
import torch
from tensordict import TensorDictBase

from aenvs._adapters.outcome import Outcome
from aenvs._specs import EnvSpec, Key, Space
from aenvs._tensors import td_get

__all__ = ["Categorical", "Composite", "EnvBase", "TorchRLAdapter", "Unbounded", "spec_of"]

# torchrl is imported by name, in this one place (aenvs.torchrl takes its names from here): it
# is an optional extra, absent from the venv where pyright checks aenvs, and partly unannotated,
# so its names are typed Any here rather than left unresolved
_data: Any = importlib.import_module("torchrl.data")
_envs: Any = importlib.import_module("torchrl.envs")
Categorical: Any = _data.Categorical
Composite: Any = _data.Composite
MultiOneHot: Any = _data.MultiOneHot
OneHot: Any = _data.OneHot
Unbounded: Any = _data.Unbounded
EnvBase: Any = _envs.EnvBase
step_mdp: Callable[..., TensorDictBase] = importlib.import_module("torchrl.envs.utils").step_mdp
# TorchRL's own gymnasium <-> TorchRL spec conversions (what its GymWrapper uses): private names
_gym: Any = importlib.import_module("torchrl.envs.libs.gym")
_space_to_spec: Callable[..., Any] = _gym._gym_to_torchrl_spec_transform
_spec_to_space: Callable[..., Space] = _gym._torchrl_to_gym_spec_transform


# -- a TorchRL env in a pool ---------------------------------------------------------------


def _space(spec: Any) -> Space:
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

    Args:
        env: the TorchRL env (an ``EnvBase`` of batch size ``[]``).

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

    def __init__(self, env: Any) -> None:
        if tuple(env.batch_size):
            raise ValueError(
                f"a TorchRL env in a pool must have batch size [] (one env per slot), got "
                f"{list(env.batch_size)}: give the pool one factory per env instead"
            )
        self.env: Any = env  # a TorchRL EnvBase
        action_specs: dict[Key, Any] = {
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
        """Never called: a TorchRL env returns its results directly, not as awaitables (raises TypeError)."""
        raise TypeError("TorchRL envs return their results directly")

    def _items(self, td: TensorDictBase) -> list[tuple[Key, Any]]:
        return [(key, td[key].numpy()) for key in self._observation_keys]

    def reset(self, seed: int | None, options: Mapping[str, Any] | None) -> Outcome:
        """Reset the env (seeded first with ``env.set_seed(seed)`` if ``seed`` is given); TorchRL
        envs take no reset ``options``."""
        if options:
            raise ValueError(f"TorchRL envs take no reset options, got {sorted(options)}")
        if seed is not None:
            self.env.set_seed(seed)
        td: TensorDictBase = self.env.reset()
        self._td = td
        return Outcome(self._items(td))

    def step(self, actions: Mapping[Key, npt.NDArray[Any]], row: int) -> Outcome:
        """Step the env with row ``row`` of ``actions`` (one-hot encoded where its action spec is
        one-hot), on top of its last output, as TorchRL's rollouts do (``step_mdp``)."""
        td = self._td
        if td is None:
            raise RuntimeError("step before the first reset")
        for key, env_key, one_hot in self._actions:
            value = torch.tensor(actions[key][row])  # a copy: the row is overwritten by the next send
            if one_hot is not None:
                categorical, dtype = one_hot
                value = categorical.to_one_hot(value).to(dtype)
            td.set(env_key, value)
        out: TensorDictBase = self.env.step(td)
        nxt: TensorDictBase = out["next"]
        terminated, truncated = _episode_end(nxt)
        self._td = step_mdp(out, keep_other=True)
        return Outcome(self._items(nxt), float(nxt["reward"]), terminated, truncated)

    def seed(self, seed: int | None) -> None:
        """Seed the env (``env.set_seed``) without resetting it."""
        self.env.set_seed(seed)

    def get_attr(self, name: str) -> Any:
        """The env's attribute ``name``."""
        return getattr(self.env, name)

    def set_attr(self, name: str, value: Any) -> None:
        """Set the env's attribute ``name``."""
        setattr(self.env, name, value)

    def close(self) -> None:
        """Close the env."""
        self.env.close()


def _episode_end(nxt: TensorDictBase) -> tuple[bool, bool]:
    """``(terminated, truncated)`` of a TorchRL step's ``"next"``, by TorchRL's rule: the
    episode ends when any of ``"done"``, ``"terminated"``, ``"truncated"`` is set.

    A ``"done"`` that neither flag explains (an env whose done spec has only ``"done"``, or
    ``StepCounter(truncated_key="done")``) counts as terminated, as TorchRL fills a missing
    ``"terminated"`` from ``"done"`` (``EnvBase._complete_done``).
    """
    flags: list[torch.Tensor | None] = [td_get(nxt, key) for key in ("done", "terminated", "truncated")]
    done, terminated, truncated = (bool(flag.any()) if flag is not None else False for flag in flags)
    return terminated or (done and not truncated), truncated


def _as_key(key: str | tuple[str, ...]) -> Key:
    return (key,) if isinstance(key, str) else tuple(key)


def _categorical(spec: Any) -> tuple[Any, torch.dtype] | None:
    """For a one-hot spec: its categorical twin (which encodes indices) and its dtype."""
    if isinstance(spec, OneHot | MultiOneHot):
        return spec.to_categorical_spec(), spec.dtype
    return None


def spec_of(space: Space) -> Any:
    """A gymnasium space as a TorchRL spec (discrete spaces as categorical, not one-hot)."""
    return _space_to_spec(space, categorical_action_encoding=True)
