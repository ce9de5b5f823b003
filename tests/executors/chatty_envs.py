"""An env whose answers are large, for the process executor's burst tests (a module of its
own with light imports: workers import it to unpickle the factories)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from aenvs import EnvContext

BLOB = 10_000  # characters in every answer's info: a few answers fill a socket's buffer


class ChattyEnv(gym.Env[np.ndarray, np.int64]):
    """Every reset and step answers with an info ``"blob"`` of :data:`BLOB` characters that
    starts ``"<env index>:<answers so far>:<reset's task>:"``."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, env_index: int) -> None:
        self.env_index = env_index
        self.answers = 0
        self.task = ""

    def _answer(self) -> tuple[np.ndarray, dict[str, Any]]:
        self.answers += 1
        blob = f"{self.env_index}:{self.answers}:{self.task}:".ljust(BLOB, "x")
        return np.array([self.env_index], np.float32), {"blob": blob}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        self.task = (options or {}).get("task", "")
        return self._answer()

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        observation, info = self._answer()
        return observation, 1.0, False, False, info


def make_chatty(ctx: EnvContext) -> ChattyEnv:
    return ChattyEnv(ctx.env_index)


class ReaderEnv(gym.Env[np.ndarray, str]):
    """Takes text actions of up to 5 MB; its observation is the length of the last one."""

    observation_space = gym.spaces.Box(0, np.inf, (1,), np.float32)
    action_space = gym.spaces.Text(max_length=5_000_000)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        return np.zeros(1, np.float32), {}

    def step(self, action: str) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return np.array([len(action)], np.float32), 0.0, False, False, {}
