"""Envs for the deadline tests (module-level classes: the process and Ray executors pickle
them by reference): a position and a text in every observation, a hang on a chosen step."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
from gymnasium import spaces
from tensordict import TensorDictBase

from aenvs import Env, EnvContext


class HangingEnv(Env):
    """Observation ``{"position": [steps], "text": "<env>:<steps>"}``, reward 1; its step
    number ``hang_at`` (counted over the env's life) blocks until the file ``release`` exists.

    ``steps_seen`` counts the steps the env was asked for, across episodes.
    """

    observation_space = spaces.Dict(
        {"position": spaces.Box(-np.inf, np.inf, (1,), np.float32), "text": spaces.Text(32)}
    )
    action_space = spaces.Discrete(2)

    def __init__(self, env_index: int, hang_at: int | None = None, release: str = "") -> None:
        self.env_index = env_index
        self.hang_at = hang_at
        self.release = release
        self.steps = 0
        self.steps_seen = 0

    def _observation(self) -> dict[str, Any]:
        return {
            "position": np.array([self.steps], dtype=np.float32),
            "text": f"{self.env_index}:{self.steps}",
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
        self.steps = 0
        return self._observation()

    def _hangs(self) -> bool:
        self.steps_seen += 1
        return self.steps_seen == self.hang_at

    def _advance(self) -> dict[str, Any]:
        self.steps += 1
        return {**self._observation(), "reward": 1.0, "terminated": False}

    def step(self, td: TensorDictBase) -> dict[str, Any]:
        if self._hangs():
            while not os.path.exists(self.release):
                time.sleep(0.005)
        return self._advance()


class AsyncHangingEnv(HangingEnv):
    """:class:`HangingEnv` whose hang awaits (the inline executor's loop stays free)."""

    async def step(self, td: TensorDictBase) -> dict[str, Any]:  # type: ignore[override]
        if self._hangs():
            # the release may come from another process: a file is the latch every executor shares
            while not os.path.exists(self.release):  # noqa: ASYNC110, ASYNC240
                await asyncio.sleep(0.005)
        return self._advance()


def hanging_env_fns(num_envs: int, hang: dict[int, int], release: str, *, asynchronous: bool) -> list[Any]:
    """Factories for ``num_envs`` envs; env ``i`` hangs at its step ``hang[i]`` (if listed)."""
    cls = AsyncHangingEnv if asynchronous else HangingEnv
    return [_Factory(cls, hang, release)] * num_envs


class _Factory:
    def __init__(self, cls: type[HangingEnv], hang: dict[int, int], release: str) -> None:
        self.cls, self.hang, self.release = cls, hang, release

    def __call__(self, ctx: EnvContext) -> HangingEnv:
        return self.cls(ctx.env_index, self.hang.get(ctx.env_index), self.release)
