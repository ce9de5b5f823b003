"""Envs for the collector tests (module level: the process and Ray executors pickle them by
reference). Each writes in its observation where it is, so a test can check that every
transition it was handed is there once, in order, from the right env and episode."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from aenvs import EnvContext


class CountingEnv(gym.Env[np.ndarray, Any]):
    """Observation ``[env_index, episode, t, tag]``: its episode number (resets so far), the
    step within it and the task's ``"tag"`` option. An episode lasts ``options["length"]``
    steps, else ``2 + (env_index + episode) % 4``. ``fail_at``: (episode, t) whose step raises;
    ``options["fail_at"]``: the step t of this episode that raises."""

    observation_space = spaces.Box(-1, 10**6, (4,), np.int64)
    action_space = spaces.Discrete(2)

    def __init__(self, ctx: EnvContext, fail_at: tuple[int, int] | None = None) -> None:
        self.index = ctx.env_index
        self.episode = -1
        self.t = 0
        self.length = 0
        self.tag = -1
        self.steps_taken = 0
        self.fail_at = fail_at

    def _obs(self) -> np.ndarray:
        return np.array([self.index, self.episode, self.t, self.tag], dtype=np.int64)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        self.episode += 1
        self.t = 0
        self.tag = int(options.get("tag", -1))
        self.length = int(options.get("length", 2 + (self.index + self.episode) % 4))
        if "fail_at" in options:
            self.fail_at = (self.episode, int(options["fail_at"]))
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.fail_at == (self.episode, self.t):
            raise RuntimeError(f"env {self.index} fails at episode {self.episode} step {self.t}")
        self.t += 1
        self.steps_taken += 1
        return self._obs(), float(action) + 1.0, self.t >= self.length, False, {}


class PromptEnv(gym.Env[str, str]):
    """A text env: reset with ``options["prompt"]`` (or a plain task, ``options["task"]``)
    observes it; each step observes ``"<prompt>|<t>|<action>"``; ``options["turns"]`` steps
    (default 3)."""

    observation_space = spaces.Text(256)
    action_space = spaces.Text(32)

    def __init__(self) -> None:
        self.prompt = ""
        self.t = 0
        self.turns = 3

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        self.prompt = str(options.get("prompt", options.get("task", "hello")))
        self.turns = int(options.get("turns", 3))
        self.t = 0
        return self.prompt, {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return f"{self.prompt}|{self.t}|{action}", float(len(action)), self.t >= self.turns, False, {}


def counting(ctx: EnvContext) -> CountingEnv:
    return CountingEnv(ctx)


def failing(ctx: EnvContext) -> CountingEnv:
    """Env 1 fails at the second step of its first episode."""
    return CountingEnv(ctx, fail_at=(0, 1) if ctx.env_index == 1 else None)


class TokensEnv(gym.Env[tuple[int, ...], Any]):
    """Observes a token list that grows by one token (the action) a step; 3 steps."""

    observation_space = spaces.Sequence(spaces.Discrete(10))
    action_space = spaces.Discrete(10)

    def __init__(self) -> None:
        self.tokens: list[int] = []

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[int, ...], dict[str, Any]]:
        super().reset(seed=seed)
        self.tokens = [1]
        return tuple(self.tokens), {}

    def step(self, action: int) -> tuple[tuple[int, ...], float, bool, bool, dict[str, Any]]:
        self.tokens.append(int(action))
        return tuple(self.tokens), 0.0, len(self.tokens) > 3, False, {}
