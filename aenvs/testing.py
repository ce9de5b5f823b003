"""Deterministic envs for testing pools (yours and ours).

Each env echoes who it is and what it was sent, so a test can check that every
send got exactly its own result: the observation of :class:`EchoEnv` is
``[env_index, last action, steps taken]``.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from aenvs.env import Env, EnvContext

__all__ = ["AsyncEchoEnv", "EchoEnv", "echo_env_fns"]


class EchoEnv(Env):
    """A plain env whose observation is ``[env_index, last action, steps taken]``.

    Args:
        env_index: echoed in every observation.
        delay: seconds each step sleeps (``time.sleep``); a ``(low, high)`` pair draws
            uniformly per step.
        episode_length: steps after which the episode terminates (None: never).
        fail_on_negative: raise ValueError when the action is negative (error injection).

    Example:
        >>> env = EchoEnv(env_index=2)
        >>> env.reset()["observation"].tolist()
        [2.0, 0.0, 0.0]
    """

    observation_space = spaces.Box(-np.inf, np.inf, (3,), np.float64)
    action_space = spaces.Box(-np.inf, np.inf, (1,), np.float64)

    def __init__(
        self,
        env_index: int = 0,
        delay: float | tuple[float, float] = 0.0,
        episode_length: int | None = None,
        fail_on_negative: bool = True,
    ) -> None:
        self.env_index = env_index
        self.delay = delay
        self.episode_length = episode_length
        self.fail_on_negative = fail_on_negative
        self.steps = 0
        self.resets = 0
        self.closed = False
        self._rng = random.Random(env_index)

    def _delay(self) -> float:
        if isinstance(self.delay, tuple):
            return self._rng.uniform(*self.delay)
        return self.delay

    def _obs(self, action: float) -> torch.Tensor:
        return torch.tensor([float(self.env_index), action, float(self.steps)], dtype=torch.float64)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> TensorDictBase:
        self.steps = 0
        self.resets += 1
        return TensorDict(observation=self._obs(0.0))

    def _advance(self, td: TensorDictBase) -> TensorDictBase:
        action = float(td["action"].item())
        if self.fail_on_negative and action < 0:
            raise ValueError(f"EchoEnv {self.env_index} got the negative action {action}")
        self.steps += 1
        done = self.episode_length is not None and self.steps >= self.episode_length
        return TensorDict(
            observation=self._obs(action),
            reward=torch.tensor([action], dtype=torch.float32),
            terminated=torch.tensor([done]),
        )

    def step(self, td: TensorDictBase) -> TensorDictBase:
        delay = self._delay()
        if delay:
            time.sleep(delay)
        return self._advance(td)

    def close(self) -> None:
        self.closed = True


class AsyncEchoEnv(EchoEnv):
    """:class:`EchoEnv` with an ``async def step`` that awaits ``asyncio.sleep(delay)``."""

    async def step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        delay = self._delay()
        await asyncio.sleep(delay)
        return self._advance(td)


def echo_env_fns(num_envs: int, *, asynchronous: bool = False, **kwargs: Any) -> list[Any]:
    """Factories for ``num_envs`` echo envs, each knowing its env index.

    Example:
        >>> fns = echo_env_fns(2, delay=0.001)
        >>> fns[1](EnvContext(1, 0, 2)).env_index
        1
    """
    cls = AsyncEchoEnv if asynchronous else EchoEnv

    def make(ctx: EnvContext) -> EchoEnv:
        return cls(env_index=ctx.env_index, **kwargs)

    return [make] * num_envs
