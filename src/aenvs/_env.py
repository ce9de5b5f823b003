"""The native env interface (TensorDicts in and out, sync or async) and its context."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from gymnasium import spaces

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from tensordict import TensorDictBase

__all__ = ["Env", "EnvContext", "EnvState"]


@dataclass(frozen=True, slots=True)
class EnvContext:
    """Where an env lives in its pool; given to the env factories that ask for it.

    A factory asks with a parameter annotated ``EnvContext`` (``EnvContext | None`` too),
    or one named ``ctx`` or ``context`` (with a default or not: ``def make(ctx=None)``), or
    with exactly one positional parameter that has no default (``lambda c: ...``). Any other
    factory is called with no argument: ``def make(seed=0)`` keeps its default, and
    ``functools.partial(gymnasium.make, "CartPole-v1")`` is never given a context.

    Example:
        >>> import gymnasium
        >>> from aenvs import EnvContext, SerialEnv
        >>> def make_env(ctx: EnvContext):  # a different gravity for each env
        ...     return gymnasium.make("Pendulum-v1", g=9.0 + ctx.env_index)
        >>> with SerialEnv(3, make_env) as env:
        ...     env.g
        [9.0, 10.0, 11.0]
    """

    env_index: int
    worker_index: int
    num_envs: int
    seed: int | None = None


class EnvState(enum.Enum):
    """Where an env slot of a pool stands.

    VOID: no env (not started, or closed). INIT: built, never reset. RESET: a reset
    is in flight. RUN: inside an episode. DONE: the last step ended the episode.
    ERROR: the last command failed.
    """

    VOID = "void"
    INIT = "init"
    RESET = "reset"
    RUN = "run"
    DONE = "done"
    ERROR = "error"


class Env:
    """Base class of native aenvs envs: TensorDicts in and out.

    Subclasses set ``observation_space`` and ``action_space`` (gymnasium spaces;
    they fix the keys, shapes and dtypes, laid out as for gymnasium envs) and
    implement ``reset`` and ``step``, either as plain methods or as ``async def``
    coroutines. ``reset`` returns the observation entries; ``step`` gets a
    TensorDict with the action entries and returns the observation entries plus
    ``"reward"`` and ``"terminated"`` (``"truncated"`` is optional), as a TensorDict
    or, cheaper to build on a hot path, a plain dict of tensors, arrays and numbers.
    Any other entry returned is passed through as is. The TensorDict ``step`` gets, and
    its tensors, are reused from step to step (the tensors view the pool's action rows,
    which the next step's actions overwrite): clone what you keep.

    Example:
        >>> import torch
        >>> from gymnasium import spaces
        >>> from tensordict import TensorDict
        >>> from aenvs import Env, SerialEnv
        >>> class Counter(Env):
        ...     observation_space = spaces.Box(0, 100, (1,))
        ...     action_space = spaces.Discrete(2)
        ...     def reset(self, *, seed=None, options=None):
        ...         self.n = 0
        ...         return TensorDict(observation=torch.zeros(1))
        ...     def step(self, td):
        ...         self.n += int(td["action"])
        ...         return TensorDict(
        ...             observation=torch.full((1,), float(self.n)),
        ...             reward=torch.ones(1),
        ...             terminated=torch.tensor([self.n >= 10]),
        ...         )
        >>> with SerialEnv(2, Counter) as env:
        ...     traj = env.rollout(3, policy=lambda td: td.set("action", torch.ones(2).long()))
        >>> traj["next", "observation"][0].flatten().tolist()
        [1.0, 2.0, 3.0]
    """

    observation_space: spaces.Space[Any]
    action_space: spaces.Space[Any]
    reward_space: ClassVar[spaces.Space[Any] | None] = None
    metadata: ClassVar[dict[str, Any]] = {}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> TensorDictBase | Awaitable[TensorDictBase]:
        """Start a new episode; return its first observation.

        Args:
            seed: seed the env's randomness with this, or None to carry on from its
                current state. A seeded pool (``set_seed``, ``reset(seed=...)``) gives each
                env its own seed.
            options: None, or the reset options given to the pool. A partial reset of
                nested groups (TorchRL's ``"_reset"`` beside a nested ``"done"``) passes the
                groups to reset as ``{"_reset": {"group": {"_reset": array([True])}, ...}}``.

        Returns:
            The observation entries, laid out as ``observation_space`` says (a ``Box``
            at ``"observation"``, a ``Dict`` space as nested keys), as a TensorDict or a
            plain dict of tensors, arrays and numbers; any other entry is passed through.
            The pool adds the ``"done"`` / ``"terminated"`` / ``"truncated"`` flags (False).
            An ``async def reset`` returns them from its coroutine.

        Example:
            >>> import torch
            >>> from gymnasium import spaces
            >>> from aenvs import Env, SerialEnv
            >>> class Still(Env):
            ...     observation_space = spaces.Box(-1, 1, (2,))
            ...     action_space = spaces.Discrete(2)
            ...     def reset(self, *, seed=None, options=None):
            ...         return {"observation": torch.zeros(2)}
            >>> with SerialEnv(2, Still) as env:
            ...     td = env.reset()
            >>> td["observation"].shape, td["done"].flatten().tolist()
            (torch.Size([2, 2]), [False, False])
        """
        raise NotImplementedError

    def step(self, td: TensorDictBase) -> TensorDictBase | Awaitable[TensorDictBase]:
        """Advance the episode by one action; return what it led to.

        Args:
            td: a TensorDict (batch size ``[]``) holding this env's action entries, laid
                out as ``action_space`` says (``"action"``; a ``Dict`` space as nested
                keys; a ``Discrete`` action as an int64 scalar tensor). It and its tensors
                are reused from step to step: clone what you keep.

        Returns:
            The observation entries (as ``reset`` returns them), ``"reward"`` (one
            number: a float, or a tensor or array of shape ``()`` or ``(1,)``; stored as
            float32) and ``"terminated"`` (a bool, or a one-element tensor or array),
            ``"truncated"`` optionally (False when absent), as a TensorDict or, cheaper to
            build, a plain dict. Any other entry
            is passed through under ``"next"``. An ``async def step`` returns them from
            its coroutine.

        Example:
            >>> import torch
            >>> from gymnasium import spaces
            >>> from aenvs import Env, SerialEnv
            >>> class Coin(Env):
            ...     observation_space = spaces.Box(-1, 1, (1,))
            ...     action_space = spaces.Discrete(2)
            ...     def reset(self, *, seed=None, options=None):
            ...         return {"observation": torch.zeros(1)}
            ...     def step(self, td):
            ...         heads = bool(td["action"])
            ...         return {"observation": torch.ones(1), "reward": float(heads), "terminated": heads}
            >>> with SerialEnv(1, Coin) as env:
            ...     td = env.reset()
            ...     td["action"] = torch.ones(1, dtype=torch.long)
            ...     out = env.step(td)
            >>> out["next", "reward"].tolist(), out["next", "terminated"].tolist()
            ([[1.0]], [[True]])
        """
        raise NotImplementedError

    def close(self) -> None:
        """Release what the env holds; called once when its pool closes."""


EnvFn = Callable[..., Any] | str
"""An env factory: a gymnasium id, or a callable returning a gymnasium env, an
:class:`~aenvs.Env` or a TorchRL env, optionally taking an :class:`~aenvs.EnvContext`."""
