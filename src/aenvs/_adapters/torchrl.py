"""A TorchRL env (an ``EnvBase``, of batch size ``[]`` or one of its own) as a pool member, in any executor."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from gymnasium import spaces
from tensordict import NonTensorData, NonTensorStack, TensorDictBase

from aenvs._adapters.outcome import Outcome
from aenvs._optional import require
from aenvs._specs import EnvSpec, Key, Space
from aenvs._tensors import from_numpy, td_get, td_keys

__all__ = [
    "Categorical",
    "Composite",
    "EnvBase",
    "NonTensorSpace",
    "TorchRLAdapter",
    "Unbounded",
    "spec_of",
]

# torchrl is imported by name, in this one place (aenvs.torchrl takes its names from here): it
# is an optional extra, absent from the venv where pyright checks aenvs, and partly unannotated,
# so its names are typed Any here rather than left unresolved
_data: Any = require("torchrl.data", extra="torchrl", feature="TorchRL interop (aenvs.torchrl)")
_envs: Any = importlib.import_module("torchrl.envs")
Categorical: Any = _data.Categorical
Composite: Any = _data.Composite
MultiOneHot: Any = _data.MultiOneHot
NonTensor: Any = _data.NonTensor
OneHot: Any = _data.OneHot
Unbounded: Any = _data.Unbounded
EnvBase: Any = _envs.EnvBase
_StepMDP: Any = importlib.import_module("torchrl.envs.utils")._StepMDP  # TorchRL's, per env
# TorchRL's own gymnasium <-> TorchRL spec conversions (what its GymWrapper uses): private names
_gym: Any = importlib.import_module("torchrl.envs.libs.gym")
_space_to_spec: Callable[..., Any] = _gym._gym_to_torchrl_spec_transform
_spec_to_space: Callable[..., Space] = _gym._torchrl_to_gym_spec_transform
_FLAGS: tuple[Key, ...] = (("done",), ("terminated",), ("truncated",))
_ROOT: tuple[Key, ...] = (("reward",), *_FLAGS)


class NonTensorSpace(spaces.Space[Any]):
    """The space of a TorchRL ``NonTensor`` entry: any Python value (text, token lists, messages...).

    Not gymnasium's ``Text`` even for strings: a ``NonTensor`` spec says nothing of a length or
    a charset, and ``Text``'s default charset (letters and digits) would refuse most text.
    Its values travel as non-tensor data (an object leaf for actions).

    Example:
        >>> space = NonTensorSpace("look")
        >>> space.sample(), space.contains("go north")
        ('look', True)
    """

    def __init__(self, example: Any = None) -> None:
        super().__init__(None, None)
        self.example = example

    def sample(self, mask: Any = None, probability: Any = None) -> Any:
        """The spec's example value (TorchRL's ``NonTensor.rand`` gives it too)."""
        return self.example

    def contains(self, x: Any) -> bool:
        """Any value belongs: the env checks what it receives."""
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NonTensorSpace) and other.example == self.example

    def __hash__(self) -> int:
        return hash(NonTensorSpace)

    def __repr__(self) -> str:
        return f"NonTensorSpace(example={self.example!r})"


# -- a TorchRL env in a pool ---------------------------------------------------------------


def _sub_env(spec: Any, batch_dims: int) -> Any:
    """One sub-env's part of a spec of a batched env (``spec[0]`` per batch dim)."""
    for _ in range(batch_dims):
        spec = spec[0]
    return spec


def _space(spec: Any) -> Space:
    """A TorchRL spec (one sub-env's) as a gymnasium space: one-hot leaves as index spaces,
    ``NonTensor`` ones as :class:`NonTensorSpace`, a tensorclass ``Composite`` as a ``Dict``
    of its fields."""
    if isinstance(spec, Composite):
        return spaces.Dict({str(key): _space(sub) for key, sub in spec.items()})
    if isinstance(spec, NonTensor):
        return NonTensorSpace(spec.example_data)
    if isinstance(spec, OneHot | MultiOneHot):
        spec = spec.to_categorical_spec()
    space = _spec_to_space(spec, categorical_action_encoding=True)
    shape = tuple(spec.shape)
    if space.shape is None or tuple(space.shape) == shape:
        return space
    # a leaf of a Composite with a shape of its own ([nested_dim]): TorchRL's conversion
    # keeps only its last dims (Binary(n), Categorical(n)); the space of the whole leaf
    if isinstance(space, spaces.MultiBinary):
        return spaces.MultiBinary(list(shape))
    if isinstance(space, spaces.Discrete | spaces.MultiDiscrete):
        return spaces.MultiDiscrete(np.full(shape, spec.space.n))
    return space


def _with_leaves(space: Space, leaves: Mapping[Key, Space]) -> Space:
    """``space`` (a ``Dict``) with ``leaves`` added at their nested keys."""
    assert isinstance(space, spaces.Dict)
    entries: dict[str, Any] = {str(name): sub for name, sub in space.items()}  # pyright: ignore[reportUnknownVariableType]
    groups: dict[str, dict[Key, Space]] = {}
    for key, leaf in leaves.items():
        if len(key) == 1:
            entries[key[0]] = leaf
        else:
            groups.setdefault(key[0], {})[key[1:]] = leaf
    for name, sub in groups.items():
        entries[name] = _with_leaves(entries.get(name, spaces.Dict()), sub)
    return spaces.Dict(entries)


def _leaf_space(spec: Any) -> Space:
    """A reward or done leaf (of any shape) as a ``Box`` of its shape and dtype."""
    shape, dtype = tuple(spec.shape), spec.dtype
    if dtype == torch.bool:
        return spaces.Box(0, 1, shape, np.bool_)  # pyright: ignore[reportArgumentType, reportCallIssue]
    return spaces.Box(-np.inf, np.inf, shape, np.dtype(str(dtype).removeprefix("torch.")).type)


def _tensorclasses(spec: Any, path: Key = ()) -> list[tuple[Key, Any]]:
    """The tensorclass entries of a Composite (key, class), outermost first."""
    found: list[tuple[Key, Any]] = []
    for key, sub in spec.items():
        if isinstance(sub, Composite):
            if sub.data_cls is not None:
                found.append(((*path, str(key)), sub.data_cls))
            found.extend(_tensorclasses(sub, (*path, str(key))))
    return found


class TorchRLAdapter:
    """Runs a TorchRL env as a pool member, as :class:`~aenvs._adapters.gym.GymAdapter` runs a
    gymnasium env.

    Its observation entries (``full_observation_spec``) are the observation keys, its
    action entries (``full_action_spec``) the action keys; a one-hot action is sent as an
    index (a ``Discrete`` space, as for gymnasium envs) and one-hot encoded here. Between
    steps the adapter keeps the env's last output (TorchRL's ``step_mdp``), so envs that
    read their state from the input TensorDict work too.

    - ``NonTensor`` entries (text...): observations arrive as non-tensor data, actions are
      object leaves (one Python value per env), set into the env's input as ``NonTensorData``.
    - Tensorclass entries (a ``Composite`` with a ``data_cls``) are carried as their fields:
      the pool's batch holds a sub-TensorDict at their key (``data_cls.from_tensordict``
      rebuilds one); actions given that way are made tensorclasses again for the env.
    - An env with a batch size of its own (``[3]``) is one member whose leaves all start
      with that shape (``EnvSpec.batch_shape``; the spaces are one sub-env's) and whose flags
      are per sub-env. Its episode "ends" when any sub-env is done: a step-and-reset then
      resets only those (TorchRL's ``"_reset"`` mask), as TorchRL's batched envs do.

    Args:
        env: the TorchRL env (an ``EnvBase``).

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
        self.env: Any = env  # a TorchRL EnvBase
        self.batch_shape: tuple[int, ...] = tuple(env.batch_size)
        dims = len(self.batch_shape)
        action_spec, observation_spec = env.full_action_spec, env.full_observation_spec
        action_specs: dict[Key, Any] = {
            _as_key(key): leaf for key, leaf in action_spec.items(include_nested=True, leaves_only=True)
        }
        observation_specs: dict[Key, Any] = {
            _as_key(key): leaf for key, leaf in observation_spec.items(include_nested=True, leaves_only=True)
        }
        if list(action_specs) == [("action",)]:  # the usual single action: a space, not a Dict
            action_space = _space(_sub_env(action_specs[("action",)], dims))
            env_keys = {("action",): ("action",)}
        else:  # several action entries: nested under "action" in the pool, where they are in the env
            action_space = _space(_sub_env(action_spec, dims))
            env_keys = {("action", *key): key for key in action_specs}
        # reward and done entries other than the root "reward" / flags (nested ones: ("data",
        # "reward")) travel as observation leaves, so each keeps its key and shape
        self._extras: dict[Key, Any] = {}
        for spec in (env.full_reward_spec, env.full_done_spec):
            for key, leaf in spec.items(include_nested=True, leaves_only=True):
                if _as_key(key) not in _ROOT:
                    self._extras[_as_key(key)] = leaf
        observation_space = _space(_sub_env(observation_spec, dims))
        if self._extras:  # a batched env's leaves as one sub-env's, as its other spaces
            leaves = {key: _leaf_space(_sub_env(leaf, dims)) for key, leaf in self._extras.items()}
            observation_space = _with_leaves(observation_space, leaves)
        self.spec = EnvSpec.from_spaces(observation_space, action_space, batch_shape=self.batch_shape)
        self._observation_keys = list(self.spec.observation_keys)
        self._object_observations = [k for k, s in observation_specs.items() if isinstance(s, NonTensor)]
        # per action leaf of the pool: the env's key, the one-hot spec that encodes it if any,
        # and whether it is non-tensor data
        self._actions = [
            (key, env_key, _categorical(action_specs[env_key]), isinstance(action_specs[env_key], NonTensor))
            for key, env_key in env_keys.items()
        ]
        self._action_classes = _tensorclasses(action_spec)
        if dims and (self._object_observations or any(obj for *_, obj in self._actions)):
            raise ValueError(
                f"a TorchRL env of batch size {list(self.batch_shape)} with non-tensor entries "
                f"({', '.join(map(_name, self._object_observations + [k for k, *_, o in self._actions if o]))}) "
                "cannot be a pool member: give the pool one factory per sub-env instead"
            )
        # TorchRL's own step_mdp for this env (what its rollouts use): step_mdp() would turn
        # the non-tensor stacks of tensorclass entries into lists the env cannot unbind
        self._step_mdp: Callable[[TensorDictBase], TensorDictBase] = _StepMDP(env, keep_other=True)
        self._td: TensorDictBase | None = None
        self._ended: torch.Tensor | None = None  # a batched env's sub-envs done at its last step
        if dims:  # per sub-env flags: written through the step's items, not Outcome's scalars
            self.autoreset = self._autoreset

    def outcome(self, out: Any, step: bool) -> Outcome:  # pragma: no cover - TorchRL envs are never async
        """Never called: a TorchRL env returns its results directly, not as awaitables (raises TypeError)."""
        raise TypeError("TorchRL envs return their results directly")

    def _items(self, td: TensorDictBase) -> list[tuple[Key, Any]]:
        items: list[tuple[Key, Any]] = []
        for key in self._observation_keys:
            leaf = td_get(td, key)
            if leaf is None:  # a nested reward at a reset: zeros
                leaf = self._extras[key].zero() if key in self._extras else td[key]
            # detached: a pool's batch carries values, not the graph that made them
            items.append((key, leaf.detach().numpy(force=True)))
        for key in self._object_observations:
            value = td_get(td, key)
            if isinstance(value, NonTensorStack):
                value = value.tolist()
            elif isinstance(value, NonTensorData):
                value = value.data
            items.append((key, value))
        return items

    def _reset_items(self, td: TensorDictBase) -> list[tuple[Key, Any]]:
        items = self._items(td)
        if self.batch_shape:  # a partial reset leaves the other sub-envs' flags as they were
            items.extend(_flags(td))
        return items

    def reset(self, seed: int | None, options: Mapping[str, Any] | None) -> Outcome:
        """Reset the env (seeded first with ``env.set_seed(seed)`` if ``seed`` is given).

        TorchRL envs take no other reset ``options`` than, for a batched env, ``"_reset"``:
        a bool mask of its batch shape (``[..., 1]`` accepted) naming the sub-envs to reset.
        """
        mask = None
        if options:
            mask = options.get("_reset") if self.batch_shape else None
            if mask is None or len(options) > 1:
                raise ValueError(f"TorchRL envs take no reset options, got {sorted(options)}")
        if seed is not None:
            self.env.set_seed(seed)
        if mask is not None and self._td is not None:
            return self._partial_reset(torch.as_tensor(np.asarray(mask), dtype=torch.bool))
        td: TensorDictBase = self.env.reset()
        self._td, self._ended = td, None
        return Outcome(self._reset_items(td))

    def _partial_reset(self, mask: torch.Tensor) -> Outcome:
        """Reset the sub-envs of ``mask`` (a batched env's), the others keeping their episode."""
        td = self._td
        assert td is not None
        mask = mask.reshape(*self.batch_shape, -1).any(-1, keepdim=True)
        td.set("_reset", mask)
        out: TensorDictBase = self.env.reset(td)
        out = out.exclude("_reset") if td_get(out, "_reset") is not None else out
        self._td, self._ended = out, None
        return Outcome(self._reset_items(out))

    def _autoreset(self) -> Outcome:
        """A batched env's reset after a step where some sub-env ended: those only."""
        if self._ended is None:
            return self.reset(None, None)
        return self._partial_reset(self._ended)

    def step(self, actions: Mapping[Key, npt.NDArray[Any]], row: int) -> Outcome:
        """Step the env with row ``row`` of ``actions`` (one-hot encoded where its action spec is
        one-hot), on top of its last output, as TorchRL's rollouts do (``step_mdp``)."""
        td = self._td
        if td is None:
            raise RuntimeError("step before the first reset")
        for key, env_key, one_hot, is_object in self._actions:
            if is_object:  # the env's own value, as sent (text, tokens...)
                td.set_non_tensor(env_key, actions[key][row])
                continue
            value = torch.tensor(actions[key][row])  # a copy: the row is overwritten by the next send
            if one_hot is not None:
                categorical, dtype = one_hot
                value = categorical.to_one_hot(value).to(dtype)
            td.set(env_key, value)
        for key, cls in self._action_classes:  # fields set into a plain TensorDict: the class again
            value = td_get(td, key)
            if not isinstance(value, cls):
                td.set(key, cls.from_tensordict(value))
        out: TensorDictBase = self.env.step(td)
        nxt: TensorDictBase = out["next"]
        self._td = self._step_mdp(out)
        if self.batch_shape:
            flags = _flags(nxt)
            done = flags[0][1]
            self._ended = from_numpy(done) if done.any() else None
            items = self._items(nxt)
            reward = td_get(nxt, "reward")  # none when the rewards are nested only: zeros
            shape = (*self.batch_shape, 1)
            items.append(
                (
                    ("reward",),
                    np.zeros(shape, np.float32)
                    if reward is None
                    else reward.reshape(shape).numpy(force=True),
                )
            )
            items.extend(flags)
            return Outcome(items, 0.0, bool(flags[1][1].any()), bool(flags[2][1].any()))
        terminated, truncated = _episode_end(nxt)
        reward = td_get(nxt, "reward")  # none in an env without one, or whose rewards are nested
        return Outcome(self._items(nxt), 0.0 if reward is None else float(reward), terminated, truncated)

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
    if all(flag is None for flag in flags):  # nested flags only (("data", "done")): any of them
        flags = [_any_flag(nxt, name) for name in ("done", "terminated", "truncated")]
    done, terminated, truncated = (bool(flag.any()) if flag is not None else False for flag in flags)
    return terminated or (done and not truncated), truncated


def _any_flag(td: TensorDictBase, name: str, shape: tuple[int, ...] = ()) -> torch.Tensor | None:
    """Whether any of ``td``'s nested flags called ``name`` is set (None if it has none), per
    sub-env of a batched env: ``shape`` is ``[*batch, 1]`` then (``()`` for one env)."""
    found: list[torch.Tensor] = []
    batch = shape[:-1]
    for key in td_keys(td, nested=True, leaves=True):
        flag = td_get(td, key) if isinstance(key, tuple) and key[-1] == name else None
        if flag is not None:
            found.append(flag.reshape(*batch, -1).any(-1, keepdim=True) if batch else flag.any())
    return torch.stack(found).any(0) if found else None


def _flags(td: TensorDictBase) -> list[tuple[Key, npt.NDArray[np.bool_]]]:
    """A batched env's done / terminated / truncated per sub-env (``[*batch, 1]``), by the rule
    of :func:`_episode_end` applied to each."""
    shape = (*td.batch_size, 1)
    found: list[torch.Tensor | None] = [td_get(td, key) for key in _FLAGS]
    if all(flag is None for flag in found):  # nested flags only: any of a sub-env's
        found = [_any_flag(td, name, shape) for (name,) in _FLAGS]
    done, terminated, truncated = (
        np.zeros(shape, bool) if flag is None else flag.reshape(shape).numpy(force=True) for flag in found
    )
    terminated = terminated | (done & ~truncated)
    return list(zip(_FLAGS, (terminated | truncated, terminated, truncated), strict=True))


def _as_key(key: str | tuple[str, ...]) -> Key:
    return (key,) if isinstance(key, str) else tuple(key)


def _name(key: Key) -> str:
    return ".".join(key)


def _categorical(spec: Any) -> tuple[Any, torch.dtype] | None:
    """For a one-hot spec: its categorical twin (which encodes indices) and its dtype."""
    if isinstance(spec, OneHot | MultiOneHot):
        return spec.to_categorical_spec(), spec.dtype
    return None


def _non_tensor_spec(space: NonTensorSpace, *args: Any, device: Any = None, **kwargs: Any) -> Any:
    """:class:`NonTensorSpace` back to TorchRL (``NonTensor``), also inside ``Dict`` spaces."""
    return NonTensor(shape=(), device=device, example_data=space.example)


_gym.register_gym_spec_conversion(NonTensorSpace)(_non_tensor_spec)


def spec_of(space: Space) -> Any:
    """A gymnasium space as a TorchRL spec (discrete spaces as categorical, not one-hot;
    :class:`NonTensorSpace` as ``NonTensor``).

    Example:
        >>> type(spec_of(NonTensorSpace("hi"))).__name__
        'NonTensor'
    """
    return _space_to_spec(space, categorical_action_encoding=True)
