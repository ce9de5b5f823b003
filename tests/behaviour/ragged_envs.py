"""Envs whose entries change shape between envs and between steps (token ids, point clouds,
a grid with two varying dims), for the variable-length tests (module-level classes: the
process and Ray executors pickle them by reference).

Every value is a function of (env ident, step), so a test knows what each env returned.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDictBase

from aenvs import Env


def token_count(ident: int, step: int) -> int:
    """How many token ids env ``ident`` returns at ``step``: the envs agree on even steps."""
    return 3 + step if step % 2 == 0 else 2 + step + 5 * ident


def tokens(ident: int, step: int) -> torch.Tensor:
    """The token ids (int64) env ``ident`` returns at ``step``."""
    n = token_count(ident, step)
    return torch.arange(n, dtype=torch.int64) * (ident + 1) + step


def cloud(ident: int, step: int) -> torch.Tensor:
    """A point cloud [k, 3] (float32) whose size differs between envs at every step."""
    k = 1 + ident + 2 * step
    return torch.arange(3 * k, dtype=torch.float32).reshape(k, 3) / (ident + 1) + step


def grid(ident: int, step: int) -> torch.Tensor:
    """A [k, m] grid whose two dims both differ between envs (no jagged tensor holds them)."""
    return torch.full((1 + ident, 2 + step + ident), float(ident * 10 + step))


class TokenEnv(Env):
    """A native env: observation [2] (ident, step) plus ``"tokens"``, ``"cloud"`` and,
    with ``with_grid``, ``"grid"`` beside it, as torch tensors of varying shape."""

    observation_space = spaces.Box(-1e6, 1e6, (2,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, ident: int = 0, with_grid: bool = False, episode: int = 1000) -> None:
        self.ident = ident
        self.with_grid = with_grid
        self.episode = episode
        self.steps = 0

    def _out(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "observation": torch.tensor([self.ident, self.steps], dtype=torch.float32),
            "tokens": tokens(self.ident, self.steps),
            "cloud": cloud(self.ident, self.steps),
        }
        if self.with_grid:
            out["grid"] = grid(self.ident, self.steps)
        return out

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
        self.steps = 0
        return self._out()

    def step(self, td: TensorDictBase) -> dict[str, Any]:
        self.steps += 1
        out = self._out()
        out["reward"] = float(td["action"])
        out["terminated"] = self.steps >= self.episode
        return out


class SequenceEnv(gym.Env[dict[str, Any], np.int64]):
    """A gymnasium env whose observation holds a ``Sequence(Discrete, stack=True)`` of token
    ids and a ``Sequence(Box(3), stack=True)`` point cloud, both of varying length."""

    observation_space = spaces.Dict(
        {
            "position": spaces.Box(-1e6, 1e6, (2,), np.float32),
            "tokens": spaces.Sequence(spaces.Discrete(100_000), stack=True),
            "cloud": spaces.Sequence(spaces.Box(-1e6, 1e6, (3,), np.float32), stack=True),
        }
    )
    action_space = spaces.Discrete(2)

    def __init__(self, ident: int = 0) -> None:
        self.ident = ident
        self.steps = 0

    def _obs(self) -> dict[str, Any]:
        return {
            "position": np.array([self.ident, self.steps], dtype=np.float32),
            "tokens": tokens(self.ident, self.steps).numpy(),
            "cloud": cloud(self.ident, self.steps).numpy(),
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.steps = 0
        return self._obs(), {}

    def step(self, action: np.int64) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        self.steps += 1
        return self._obs(), float(action), False, False, {"ids": tokens(self.ident, self.steps).numpy()}
