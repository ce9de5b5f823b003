"""TorchRL interop, both ways (needs the ``torchrl`` extra: ``pip install aenvs[torchrl]``).

- A TorchRL env (an ``EnvBase`` with batch size ``[]``) can be one of a pool's envs:
  factories may return one, and :class:`TorchRLAdapter` runs it in any executor, laid out
  like a gymnasium env with the same spaces (``"observation"`` and the other observation
  keys at the root, one-hot actions taken as indices).
- :class:`AenvsWrapper` is a TorchRL ``EnvBase`` over an :class:`aenvs.SerialEnv` /
  :class:`aenvs.ParallelEnv`, for TorchRL's tools that want an ``EnvBase``, such as its
  single-process collector (``SyncDataCollector``, named ``Collector`` since torchrl 0.14).

Example:
    >>> from torchrl.collectors import Collector
    >>> from torchrl.envs import GymEnv
    >>> env = AenvsWrapper(aenvs.ParallelEnv(4, lambda: GymEnv("CartPole-v1")))
    >>> collector = Collector(env, None, frames_per_batch=64, total_frames=640)
    >>> for batch in collector:  # random policy: batch [4, 16]
    ...     ...
    >>> collector.shutdown()  # closes env, and the ParallelEnv's workers with it
"""

# pyright: reportMissingImports=false
# (torchrl is an optional extra that the main dev venv lacks; .venv-torchrl's tests run this module)

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDictBase
from torchrl.data import Categorical, Composite, MultiOneHot, OneHot, Unbounded
from torchrl.envs import EnvBase
from torchrl.envs.utils import step_mdp

# TorchRL's own gymnasium <-> TorchRL spec conversions (what its GymWrapper uses): private
# names, so they are imported in this one place
from torchrl.envs.libs.gym import (  # isort: skip
    _gym_to_torchrl_spec_transform as _space_to_spec,
    _torchrl_to_gym_spec_transform as _spec_to_space,
)

from aenvs.gym import Outcome
from aenvs.specs import EnvSpec, Key

if TYPE_CHECKING:
    from aenvs.sync import BatchedEnv

__all__ = ["AenvsWrapper", "TorchRLAdapter"]


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
    """Runs a TorchRL env (batch size ``[]``) as a pool member, as :class:`~aenvs.gym.GymAdapter`
    runs a gymnasium env.

    Its observation entries (``full_observation_spec``) are the observation keys, its
    action entries (``full_action_spec``) the action keys; a one-hot action is sent as an
    index (a ``Discrete`` space, as for gymnasium envs) and one-hot encoded here. Between
    steps the adapter keeps the env's last output (TorchRL's ``step_mdp``), so envs that
    read their state from the input TensorDict work too.

    Example:
        >>> from torchrl.envs import GymEnv
        >>> pool = AsyncEnvPool([lambda: GymEnv("CartPole-v1")] * 4, executor="thread")
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


# -- an aenvs batched env as a TorchRL env -----------------------------------------------------


class AenvsWrapper(EnvBase):
    """A TorchRL ``EnvBase`` over an aenvs :class:`~aenvs.SerialEnv` / :class:`~aenvs.ParallelEnv`.

    Its specs come from the envs' gymnasium spaces (which every env must share), batched
    like the env (``batch_size [num_envs]``); ``Discrete`` actions are categorical (int64
    indices, as aenvs takes them). Each ``step`` / ``reset`` is one call of the batched env,
    partial steps (``"_step"``: the envs left out keep their input values) and partial resets
    (``"_reset"``) included; ``"env_index"`` is left out of the outputs.
    Closing the wrapper closes the batched env.

    Args:
        env: the batched env to run.

    Example:
        >>> env = AenvsWrapper(aenvs.SerialEnv(2, lambda: gymnasium.make("CartPole-v1")))
        >>> env.rollout(10).batch_size
        torch.Size([2, 10])
    """

    def __init__(self, env: BatchedEnv) -> None:
        super().__init__(batch_size=env.batch_size, device=None)
        self._env = env
        batch = tuple(env.batch_size)
        observation_space = env.observation_space  # ValueError if the envs' spaces differ
        if isinstance(observation_space, spaces.Dict):
            self.observation_spec = _spec(observation_space, batch)
        else:
            self.observation_spec = Composite(observation=_spec(observation_space, batch), shape=batch)
        self.action_spec = _spec(env.action_space, batch)
        self.reward_spec = Unbounded(shape=(*batch, 1), dtype=torch.float32)
        flag = Categorical(2, shape=(*batch, 1), dtype=torch.bool)
        self.full_done_spec = Composite(
            done=flag, terminated=flag.clone(), truncated=flag.clone(), shape=batch
        )
        self._reset_keys = [leaf.key for leaf in env.env_specs[0].reset_leaves]
        self._step_keys = [leaf.key for leaf in env.env_specs[0].step_leaves]
        self._action_keys = list(self.full_action_spec.keys(include_nested=True, leaves_only=True))

    @property
    def env(self) -> BatchedEnv:
        """The wrapped batched env."""
        return self._env

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        if tensordict is not None:
            masks = [key for key in tensordict.keys(include_nested=True) if _last(key) == "_reset"]
            tensordict = tensordict.select(*masks, *self._reset_keys, strict=False) if masks else None
        out = self._env.reset(tensordict, **kwargs)
        return out.select(*self._reset_keys)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if "_step" in tensordict.keys():
            # a partial step: the envs left out keep their input values (observations, done
            # flags), so the batched env needs them as well as the actions
            keys = [*self._action_keys, *self._step_keys, "_step"]
        else:
            keys = self._action_keys
        out = self._env.step(tensordict.select(*keys, strict=False))
        return out.get("next").select(*self._step_keys)

    def _set_seed(self, seed: int | None) -> None:
        self._env.set_seed(seed)

    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seed env ``k`` with the ``k``-th seed of TorchRL's chain; return the next seed
        (as TorchRL's batched envs do)."""
        return self._env.set_seed(seed, static_seed)

    def close(self, *, raise_if_closed: bool = True) -> None:
        self._env.close()
        super().close(raise_if_closed=raise_if_closed)


def _spec(space: spaces.Space, batch: tuple[int, ...]) -> Any:
    """A gymnasium space as a TorchRL spec (categorical for Discrete) with batch dims ``batch``."""
    spec = _space_to_spec(space, categorical_action_encoding=True)
    return spec.expand(batch) if isinstance(spec, Composite) else spec.expand(*batch, *spec.shape)


def _last(key: str | tuple[str, ...]) -> str:
    return key if isinstance(key, str) else key[-1]
