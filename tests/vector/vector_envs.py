"""Envs for the gymnasium vector env tests (importable by worker processes)."""

from __future__ import annotations

import asyncio
import copy
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from tests.helpers import Gate

BOX = spaces.Box(-1, 1, (3,), np.float32)
SPACES: dict[str, spaces.Space] = {
    "box": BOX,
    "box64": spaces.Box(-2, 2, (2, 2), np.float64),
    "discrete": spaces.Discrete(5, start=-2),
    "multidiscrete": spaces.MultiDiscrete([3, 4]),
    "multibinary": spaces.MultiBinary(3),
    "dict": spaces.Dict({"pos": BOX, "mode": spaces.Discrete(3)}),
    "tuple": spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 1, (2,), np.float64))),
    "nested": spaces.Dict(
        {"a": spaces.Tuple((BOX, spaces.MultiBinary(2))), "b": spaces.Dict({"c": spaces.MultiDiscrete([2])})}
    ),
    # integer spaces of other dtypes than int64: the pool carries them as int64
    "discrete8": spaces.Discrete(4, start=-1, dtype=np.int8),
    "multidiscrete32": spaces.MultiDiscrete([3, 4], dtype=np.int32),
    "narrow": spaces.Dict(
        {
            "d": spaces.Discrete(3, dtype=np.int16),
            "t": spaces.Tuple(
                (spaces.MultiDiscrete([2, 5], dtype=np.uint8), spaces.Discrete(2, start=-1, dtype=np.int32))
            ),
        }
    ),
}


def dtypes_match(space: spaces.Space, value: Any) -> bool:
    """Whether every leaf of ``value`` has exactly the dtype of its space (``in`` casts some)."""
    if isinstance(space, spaces.Dict):
        return all(dtypes_match(sub, value[k]) for k, sub in space.spaces.items())
    if isinstance(space, spaces.Tuple):
        return all(dtypes_match(sub, v) for sub, v in zip(space.spaces, value, strict=True))
    return np.asarray(value).dtype == space.dtype


class SpaceEnv(gym.Env):
    """Random observations of any space, seeded through ``reset``; episodes of 2 to 6 steps.

    Rewards are float64 draws (float32 cannot hold them), infos mix numbers, arrays,
    strings and nested dicts, and the step checks its action against the action space:
    the vector env must hand everything over as gymnasium's vector envs do.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"]}

    def __init__(
        self, observation_space: str = "box", action_space: str = "box", truncate: bool = False
    ) -> None:
        # own copies: an env seeds its observation space, and envs may run in threads
        self.observation_space = copy.deepcopy(SPACES[observation_space])
        self.action_space = copy.deepcopy(SPACES[action_space])
        self.truncate = truncate
        self.t = 0
        self.length = 0
        self.resets = 0
        self.label = "env"

    def _obs(self) -> Any:
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample()

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(2, 7))
        self.resets += 1
        info: dict[str, Any] = {"resets": self.resets}
        if options:
            info["options"] = sorted(options)
        return self._obs(), info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        assert self.action_space.contains(action), f"{action!r} not in {self.action_space}"
        assert dtypes_match(self.action_space, action), f"{action!r} not in the dtypes of {self.action_space}"
        self.t += 1
        ended = self.t >= self.length
        info: dict[str, Any] = {"t": self.t, "noise": self.np_random.normal(size=2)}
        if ended:
            info["ended"] = {"length": np.int32(self.t), "label": self.label}
        reward = float(self.np_random.normal())
        return self._obs(), reward, ended and not self.truncate, ended and self.truncate, info

    def render(self) -> np.ndarray:
        return np.full((2, 2, 3), self.t, dtype=np.uint8)

    def double(self, x: int) -> int:
        return 2 * x


class FailingEnv(SpaceEnv):
    """Raises ``error`` (default ``RuntimeError("boom")``) in its step number ``fail_at``
    (counted over its lifetime)."""

    def __init__(self, fail_at: int, error: BaseException | None = None) -> None:
        super().__init__()
        self.fail_at = fail_at
        self.error = error
        self.steps = 0

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.steps += 1
        if self.steps == self.fail_at:
            raise self.error or RuntimeError("boom")
        return super().step(action)


class CoroutineSpaceEnv(SpaceEnv):
    """SpaceEnv with ``async def`` reset and step that suspend first: step for step equal to it."""

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict]:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().reset(seed=seed, options=options)

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:  # type: ignore[override]
        await asyncio.sleep(0)
        return super().step(action)


class GatedSpaceEnv(CoroutineSpaceEnv):
    """Its first reset waits (off the loop) until ``reset_gate`` opens, its first step until
    ``step_gate`` does: gates are files, so that the test opens them across processes."""

    def __init__(self, reset_gate: Gate, step_gate: Gate) -> None:
        super().__init__()
        self.gates = {"reset": reset_gate, "step": step_gate}

    async def _wait(self, call: str) -> None:
        gate = self.gates.pop(call, None)
        if gate is not None:
            assert await asyncio.to_thread(gate.wait), f"the test never opened the {call} gate"

    async def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict]:  # type: ignore[override]
        await self._wait("reset")
        return await super().reset(seed=seed, options=options)

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:  # type: ignore[override]
        await self._wait("step")
        return await super().step(action)
