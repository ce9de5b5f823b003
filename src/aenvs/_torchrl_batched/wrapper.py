"""AenvsWrapper: a TorchRL ``EnvBase`` over an aenvs batched env (exported by :mod:`aenvs.torchrl`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from gymnasium import spaces
from tensordict import TensorDictBase
from tensordict.utils import NestedKey

# torchrl's names, typed Any (torchrl is an optional extra: see aenvs._adapters.torchrl)
from aenvs._adapters.torchrl import Categorical, Composite, EnvBase, Unbounded, spec_of
from aenvs._layout import TIMED_OUT
from aenvs._specs import Space, observation_root, space_leaves
from aenvs._tensors import td_keys

if TYPE_CHECKING:
    from aenvs._sync import BatchedEnv

__all__ = ["AenvsWrapper"]


# -- an aenvs batched env as a TorchRL env -----------------------------------------------------


class AenvsWrapper(EnvBase):
    """A TorchRL ``EnvBase`` over an aenvs :class:`~aenvs.SerialEnv` / :class:`~aenvs.ParallelEnv`.

    Its specs come from the envs' gymnasium spaces (which every env must share), batched
    like the env (``batch_size [num_envs]``); ``Discrete`` actions are categorical (int64
    indices, as aenvs takes them). Each ``step`` / ``reset`` is one call of the batched env,
    partial steps (``"_step"``: the envs left out keep their input values) and partial resets
    (``"_reset"``) included; ``"env_index"`` is left out of the outputs. With the env's
    ``on_timeout="truncate"``, ``"timed_out"`` is a done entry of its specs beside
    ``"truncated"``: True where a timeout ended the episode (False after a reset).
    Closing the wrapper closes the batched env.

    Args:
        env: the batched env to run.

    Example:
        >>> import aenvs, gymnasium
        >>> from aenvs.torchrl import AenvsWrapper
        >>> env = AenvsWrapper(aenvs.SerialEnv(2, lambda: gymnasium.make("CartPole-v1")))
        >>> env.rollout(10, break_when_any_done=False).batch_size
        torch.Size([2, 10])
        >>> env.close()  # closes the SerialEnv too
    """

    def __init__(self, env: BatchedEnv) -> None:
        EnvBase.__init__(self, batch_size=env.batch_size, device=None)
        self._env = env
        batch = tuple(env.batch_size)
        observation_space = env.observation_space  # ValueError if the envs' spaces differ
        observation_spec = _spec(observation_space, batch)
        if isinstance(observation_space, spaces.Dict):
            self.observation_spec = observation_spec
        else:
            self.observation_spec = Composite(observation=observation_spec, shape=batch)
        self.action_spec = _spec(env.action_space, batch)
        self.reward_spec = Unbounded(shape=(*batch, 1), dtype=torch.float32)
        flag = Categorical(2, shape=(*batch, 1), dtype=torch.bool)
        flags = {"done": flag, "terminated": flag.clone(), "truncated": flag.clone()}
        timed_out = env.pool.on_timeout == "truncate"  # its steps flag the episodes a timeout ended
        if timed_out:
            flags[TIMED_OUT] = flag.clone()
        self.full_done_spec = Composite(flags, shape=batch)
        first = env.env_specs[0]
        # observations without a fixed shape (text...) have no leaf: their keys, kept too
        space = first.observation_space
        objects = [
            leaf.key for leaf in space_leaves(space, observation_root(space), objects=True) if leaf.is_object
        ]
        self._reset_keys = [*(leaf.key for leaf in first.reset_leaves), *objects]
        self._step_keys = [*(leaf.key for leaf in first.step_leaves), *objects]
        if timed_out:
            self._step_keys.append((TIMED_OUT,))
        self._action_keys: list[NestedKey] = list(
            self.full_action_spec.keys(include_nested=True, leaves_only=True)
        )

    @property
    def env(self) -> BatchedEnv:
        """The wrapped batched env."""
        return self._env

    def _reset(self, tensordict: TensorDictBase | None, **kwargs: Any) -> TensorDictBase:
        if tensordict is not None:
            masks = [key for key in td_keys(tensordict, nested=True) if _last(key) == "_reset"]
            tensordict = tensordict.select(*masks, *self._reset_keys, strict=False) if masks else None
        out = self._env.reset(tensordict, **kwargs)
        return out.select(*self._reset_keys)

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        if "_step" in td_keys(tensordict):
            # a partial step: the envs left out keep their input values (observations, done
            # flags), so the batched env needs them as well as the actions
            keys = [*self._action_keys, *self._step_keys, "_step"]
        else:
            keys = self._action_keys
        out = self._env.step(tensordict.select(*keys, strict=False))
        nxt: TensorDictBase = out["next"]
        return nxt.select(*self._step_keys)

    def step_and_reset_rows(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """A step that also resets the envs whose episode ended: the step's ``"next"`` entries
        and the reset's (the input of the next step, as :meth:`_reset` lays it out)."""
        out, reset = self._env.step_and_maybe_reset(tensordict.select(*self._action_keys, strict=False))
        nxt: TensorDictBase = out["next"]
        return nxt.select(*self._step_keys), reset.select(*self._reset_keys)

    def _set_seed(self, seed: int | None) -> None:
        self._env.set_seed(seed)

    def set_seed(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        """Seed env ``k`` with the ``k``-th seed of TorchRL's chain; return the next seed
        (as TorchRL's batched envs do)."""
        return self._env.set_seed(seed, static_seed)

    def close(self, *, raise_if_closed: bool = True) -> None:
        """Close the batched env (its workers), then this env as TorchRL's ``EnvBase.close`` does."""
        self._env.close()
        EnvBase.close(self, raise_if_closed=raise_if_closed)


def _spec(space: Space, batch: tuple[int, ...]) -> Any:
    """A gymnasium space as a TorchRL spec (categorical for Discrete) with batch dims ``batch``."""
    spec = spec_of(space)
    return spec.expand(batch) if isinstance(spec, Composite) else spec.expand(*batch, *spec.shape)


def _last(key: NestedKey) -> NestedKey:
    return key if isinstance(key, str) else key[-1]
