"""Gymnasium envs for the ``aenvs run`` tests, registered under ids the command line takes
(``tests.cli_envs:AenvsCliSleepy-v0`` imports this module first, in any worker too)."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

SLEEPY = "tests.cli_envs:AenvsCliSleepy-v0"  # 2 ms steps, episodes of 3 steps
STALL = "tests.cli_envs:AenvsCliStall-v0"  # the 3rd step of an env's life takes 0.5 s
LONG = "tests.cli_envs:AenvsCliLong-v0"  # 5 ms steps, episodes that never end by themselves


class SleepyEnv(gym.Env[np.ndarray, np.int64]):
    """Sleeps ``delay`` seconds a step; an episode ends after ``length`` steps; the env's
    ``stall_at``-th step since it was built sleeps ``stall`` seconds instead."""

    def __init__(self, delay: float = 0.002, length: int = 3, stall_at: int = -1, stall: float = 0.0) -> None:
        self.observation_space = spaces.Box(0.0, np.inf, (1,), np.float32)
        self.action_space = spaces.Discrete(2)
        self.delay, self.length, self.stall_at, self.stall = delay, length, stall_at, stall
        self.t = 0
        self.lived = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: np.int64) -> Any:
        time.sleep(self.stall if self.lived == self.stall_at else self.delay)
        self.lived += 1
        self.t += 1
        return np.full(1, self.t, np.float32), 1.0, self.t >= self.length, False, {}


for _id, _kwargs in (
    ("AenvsCliSleepy-v0", {}),
    ("AenvsCliStall-v0", {"delay": 0.001, "length": 4, "stall_at": 2, "stall": 0.5}),
    ("AenvsCliLong-v0", {"delay": 0.005, "length": 10**9}),
):
    if _id not in gym.registry:  # imported twice (as a doctest module too): register once
        gym.register(_id, entry_point="tests.cli_envs:SleepyEnv", kwargs=_kwargs)
