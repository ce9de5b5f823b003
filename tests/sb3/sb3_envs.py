"""Envs for the Stable-Baselines3 vector env tests (importable by worker processes)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit

OBSERVATION_SPACES: dict[str, spaces.Space[Any]] = {
    "box": spaces.Box(-10, 10, (3,), np.float32),
    "dict": spaces.Dict({"pos": spaces.Box(-10, 10, (2,), np.float64), "count": spaces.Discrete(10)}),
    "tuple": spaces.Tuple((spaces.Box(-10, 10, (2,), np.float32), spaces.Discrete(10))),
    "boxes": spaces.Dict({"pos": spaces.Box(-10, 10, (2,), np.float64), "vel": spaces.Box(-10, 10, (1,))}),
}
LIMIT = 4  # TimeLimit's max_episode_steps around each CountingEnv


class CountingEnv(gym.Env[Any, Any]):
    """Episodes that terminate after ``length`` steps; seeded random observations of any of
    :data:`OBSERVATION_SPACES`; an info on every step and reset (the reset's says its seed
    and options); a float64 reward float32 cannot hold; ``rgb_array`` frames."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"]}

    def __init__(self, length: int = 3, obs: str = "box", render_mode: str | None = None) -> None:
        self.length, self.render_mode = length, render_mode
        self.observation_space = OBSERVATION_SPACES[obs]
        self.action_space = spaces.Discrete(3)
        self.t = 0
        self.last_options: dict[str, Any] | None = None

    def _obs(self) -> Any:
        space = self.observation_space
        if isinstance(space, spaces.Dict) and "vel" in space.spaces:  # for VecFrameStack: Boxes only
            return {"pos": self.np_random.normal(size=2), "vel": np.full(1, self.t, np.float32)}
        if isinstance(space, spaces.Dict):
            return {"pos": self.np_random.normal(size=2), "count": self.t}
        if isinstance(space, spaces.Tuple):
            return (self.np_random.normal(size=2).astype(np.float32), self.t)
        return self.np_random.normal(size=3).astype(np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t, self.last_options = 0, options
        return self._obs(), {"seed": seed, "options": options}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return self._obs(), 0.1 * self.t + int(action), self.t >= self.length, False, {"t": self.t}

    def render(self) -> np.ndarray:
        return np.full((2, 3, 3), self.t, np.uint8)

    def double(self, x: int, *, plus: int = 0) -> int:
        return 2 * x + plus


def counting_env(length: int, obs: str = "box", render_mode: str | None = None) -> gym.Env[Any, Any]:
    return TimeLimit(CountingEnv(length, obs, render_mode), max_episode_steps=LIMIT)


def counting_env_fns(obs: str = "box", n: int = 4, **kwargs: Any) -> list[Callable[[], gym.Env[Any, Any]]]:
    """Env ``i`` terminates after ``2 + i`` steps and is truncated after :data:`LIMIT`: with 4
    envs, one episode ends terminated and truncated at once, one truncated only."""
    return [functools.partial(counting_env, 2 + i, obs, **kwargs) for i in range(n)]


class DictActionEnv(gym.Env[np.ndarray, dict[str, Any]]):
    """Observes the last action it was given (Dict action space)."""

    def __init__(self) -> None:
        self.action_space = spaces.Dict({"a": spaces.Discrete(4), "b": spaces.Box(0, 1, (2,), np.float32)})
        self.observation_space = spaces.Box(0, 4, (3,), np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(3, np.float32), {}

    def step(self, action: dict[str, Any]) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs = np.array([action["a"], *action["b"]], np.float32)
        return obs, 0.0, False, False, {}
