"""Checking envs against their specs.

:func:`check_env_specs` runs a short rollout and checks every entry of every env
against the gymnasium spaces the env declares (keys, shapes, dtypes, and bounds where
they are finite).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, cast

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDictBase

from aenvs._errors import AenvsError
from aenvs._object_actions import values_per_row
from aenvs._specs import EnvSpec, Key, Leaf, Space, observation_root, space_leaves
from aenvs._tensors import plain_value, td_get, torch_dtype

__all__ = ["EnvSpecError", "check_env_specs"]


class EnvSpecError(AenvsError, AssertionError):
    """An env's output does not match its specs; the message names the env, the key and the mismatch.

    An ``AssertionError`` too, as TorchRL's ``check_env_specs`` raises.
    """


# -- checking ---------------------------------------------------------------------------------


class _Checkable(Protocol):
    """What :func:`check_env_specs` needs: the sync shim's surface."""

    @property
    def env_specs(self) -> list[EnvSpec]: ...

    def reset(self, tensordict: TensorDictBase | None = None) -> TensorDictBase: ...

    def rollout(self, max_steps: int, *args: Any, **kwargs: Any) -> TensorDictBase: ...

    def set_seed(self, seed: int | None = None) -> Any: ...


def _space_items(space: Space, path: Key) -> Iterator[tuple[Key, Space]]:
    """(key, leaf space) pairs of a space, as :func:`aenvs._specs.space_leaves` lays them out."""
    if isinstance(space, spaces.Dict):
        for k, sub in cast("spaces.Dict[Any]", space).spaces.items():
            yield from _space_items(sub, (*path, k))
    elif isinstance(space, spaces.Tuple):
        for i, sub in enumerate(cast("spaces.Tuple[Any]", space).spaces):
            yield from _space_items(sub, (*path, str(i)))
    else:
        yield path, space


def _bounds_error(space: Space, value: torch.Tensor) -> str | None:
    """Why ``value`` (a batch of samples) is out of ``space``'s bounds, or None."""
    v = value.detach().to(torch.float64) if value.dtype != torch.bool else value.to(torch.float64)
    if isinstance(space, spaces.Discrete):
        low, high = int(space.start), int(space.start) + int(space.n) - 1
        bad = (v < low) | (v > high)
        if bool(bad.any()):
            return f"value {v[bad][0].item():g} outside [{low}, {high}]"
        return None
    if isinstance(space, spaces.MultiDiscrete):
        space = cast("spaces.MultiDiscrete[Any]", space)
        low = torch.as_tensor(np.asarray(space.start), dtype=torch.float64)
        high = low + torch.as_tensor(np.asarray(space.nvec), dtype=torch.float64) - 1
    elif isinstance(space, spaces.MultiBinary):
        low, high = (
            torch.zeros(space.shape, dtype=torch.float64),
            torch.ones(space.shape, dtype=torch.float64),
        )
    elif isinstance(space, spaces.Box):
        space = cast("spaces.Box[Any]", space)
        low = torch.as_tensor(np.asarray(space.low, dtype=np.float64))
        high = torch.as_tensor(np.asarray(space.high, dtype=np.float64))
    else:
        return None
    bad = ((v < low) & torch.isfinite(low)) | ((v > high) & torch.isfinite(high))
    if bool(bad.any()):
        position = [int(i) for i in bad.nonzero()[0]]
        return (
            f"value {v[tuple(position)].item():g} at index {position[1:] or []} is outside "
            f"[{low.broadcast_to(v.shape)[tuple(position)].item():g}, "
            f"{high.broadcast_to(v.shape)[tuple(position)].item():g}]"
        )
    return None


def _check_leaf(
    td: TensorDictBase,
    key: Key,
    leaf: Leaf,
    space: Space | None,
    who: str,
    where: str,
) -> None:
    name = ".".join(key)
    value = td_get(td, key)
    if value is None:
        raise EnvSpecError(f"{who}: the {where} has no {name!r} entry; its specs give {leaf.describe()}")
    if leaf.is_object:  # non-tensor values (text, token lists...): each in its space
        rows = int(td.batch_size.numel())
        for step, item in enumerate(values_per_row(value, rows) if td.batch_dims else [value]):
            if space is not None and not space.contains(plain_value(item)):
                raise EnvSpecError(
                    f"{who}: {name!r} in the {where} at step {step} is not in its space {space}"
                )
        return
    if not isinstance(value, torch.Tensor):
        raise EnvSpecError(f"{who}: {name!r} in the {where} is {type(value).__name__}, not a tensor")
    shape = tuple(value.shape[td.batch_dims :])
    if shape != tuple(leaf.shape):
        raise EnvSpecError(
            f"{who}: {name!r} in the {where} has shape {shape} per step, its specs say {tuple(leaf.shape)}"
        )
    expected = torch_dtype(leaf.dtype)
    if value.dtype != expected:
        raise EnvSpecError(
            f"{who}: {name!r} in the {where} has dtype {value.dtype}, its specs say {expected}"
        )
    if space is not None:
        why = _bounds_error(space, value)
        if why is not None:
            raise EnvSpecError(f"{who}: {name!r} in the {where} is out of its space {space}: {why}")


def _check_env(td: TensorDictBase, spec: EnvSpec, who: str) -> None:
    """Check one env's trajectory (batch ``[T]``) against its spec."""
    root = observation_root(spec.observation_space)
    obs = dict(_space_items(spec.observation_space, root))
    actions = dict(_space_items(spec.action_space, spec.action_root))
    spaces_by_key: dict[Key, Space] = {**obs, **actions, ("reward",): spec.reward_space}
    nxt = td_get(td, "next")
    if not isinstance(nxt, TensorDictBase):
        raise EnvSpecError(f"{who}: the step output has no 'next' entry")
    for leaf in spec.step_leaves:
        _check_leaf(nxt, leaf.key, leaf, spaces_by_key.get(leaf.key), who, "step output ('next')")
    for leaf in spec.reset_leaves:  # the reset's, where the step outputs were already checked
        _check_leaf(td, leaf.key, leaf, spaces_by_key.get(leaf.key), who, "input (reset or previous step)")
    for leaf in spec.action_leaves:
        _check_leaf(td, leaf.key, leaf, spaces_by_key.get(leaf.key), who, "input")
    # observation parts without a fixed shape (Text, Sequence, Graph...): non-tensor entries
    objects = [leaf for leaf in space_leaves(spec.observation_space, root, objects=True) if leaf.is_object]
    for leaf in objects:
        _check_leaf(nxt, leaf.key, leaf, obs[leaf.key], who, "step output ('next')")
        _check_leaf(td, leaf.key, leaf, obs[leaf.key], who, "input (reset or previous step)")
    for where, flags in (("input", td), ("step output ('next')", nxt)):
        done, terminated, truncated = (td_get(flags, k) for k in ("done", "terminated", "truncated"))
        if not torch.equal(done, terminated | truncated):
            raise EnvSpecError(f"{who}: 'done' in the {where} is not 'terminated' or 'truncated'")


def check_env_specs(env: _Checkable, max_steps: int = 3, *, seed: int | None = None) -> None:
    """Run a short rollout and check every output against the envs' specs.

    Checks, for every env: each observation, action, reward and done / terminated /
    truncated entry is there, with the shape and dtype its spaces give, within their
    bounds where finite, and ``done == terminated | truncated``; each value of a space
    without a fixed shape (``Text``, ``Sequence``, ``Graph``, ``OneOf``, custom spaces),
    observation or action, is in its space.

    Args:
        env: a :class:`~aenvs.SerialEnv` / :class:`~aenvs.ParallelEnv`.
        max_steps: steps of the rollout (done envs are reset and go on).
        seed: seed the envs first (``env.set_seed``).

    Raises:
        EnvSpecError: naming the env, the key and the mismatch.

    Example:
        >>> import gymnasium
        >>> from aenvs import SerialEnv, check_env_specs
        >>> with SerialEnv(2, lambda: gymnasium.make("CartPole-v1")) as env:
        ...     check_env_specs(env)  # raises EnvSpecError on a mismatch
    """
    if seed is not None:
        env.set_seed(seed)
    specs = env.env_specs
    trajectory = env.rollout(max_steps, break_when_any_done=False)
    for i, spec in enumerate(specs):
        _check_env(trajectory[i], spec, f"env {i} ({_describe(spec)})")


def _describe(spec: EnvSpec) -> str:
    return f"observation space {spec.observation_space}, action space {spec.action_space}"
