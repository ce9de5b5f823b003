"""Envs for the sync shim tests (importable by worker processes)."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from aenvs import Env, EnvContext
from aenvs.testing import EchoEnv
from tests.helpers import Gate

_VAL: spaces.Space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
_FLAG: spaces.Space = spaces.Box(0, 1, (1,), np.dtype("bool"))  # pyright: ignore[reportCallIssue, reportArgumentType]


class ValEnv(Env):
    """An env of ``"val"`` entries: reset writes zeros, a step adds the action to every val.

    ``groups=()``: one root ``"val"``. Otherwise one group per name, each with its own
    ``"val"`` and ``"done"`` (set once the group's val reaches ``limit``), as multi-agent
    envs lay out agent groups. A reset whose ``options["_reset"]`` names groups resets
    only those (the pool passes the masks of a nested partial reset that way).
    """

    action_space = spaces.Box(-10, 10, (1,), np.float32)

    def __init__(self, groups: tuple[str, ...] = ("agent0", "agent1"), limit: float = 3.0) -> None:
        self.groups = groups
        self.limit = limit
        if groups:
            self.observation_space = spaces.Dict(
                {g: spaces.Dict({"val": _VAL, "done": _FLAG}) for g in groups}
            )
        else:
            self.observation_space = spaces.Dict({"val": _VAL})
        self.vals = dict.fromkeys(groups or ("",), 0.0)
        self.g = 9.81
        self.resets = 0
        self.last_options: dict[str, Any] | None = None

    def _observation(self) -> dict[str, Any]:
        if not self.groups:
            return {"val": torch.tensor([self.vals[""]])}
        return {
            g: {"val": torch.tensor([v]), "done": torch.tensor([v >= self.limit])}
            for g, v in self.vals.items()
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> TensorDictBase:
        self.resets += 1
        self.last_options = options
        masks = (options or {}).get("_reset")
        for g in self.vals:
            if masks is None or g not in masks or bool(np.any(masks[g]["_reset"])):
                self.vals[g] = 0.0
        return TensorDict(self._observation())

    def step(self, td: TensorDictBase) -> TensorDictBase:
        action = float(td["action"].item())
        for g in self.vals:
            self.vals[g] += action
        obs = self._observation()
        done = all(v >= self.limit for v in self.vals.values())
        return TensorDict({**obs, "reward": torch.tensor([action]), "terminated": torch.tensor([done])})

    def scaled(self, factor: float) -> list[float]:
        """A method to forward: every val times ``factor``."""
        return [v * factor for v in self.vals.values()]


class HoldingEnv(EchoEnv):
    """EchoEnv whose step opens ``started``, then holds until ``release`` is opened."""

    def __init__(self, started: Gate, release: Gate, env_index: int = 0) -> None:
        super().__init__(env_index=env_index)
        self.started = started
        self.release = release

    def step(self, td: TensorDictBase) -> TensorDictBase:
        self.started.open()
        assert self.release.wait(60), "the test never released the env"
        return self._advance(td)


class HoldAtStepEnv(EchoEnv):
    """EchoEnv (plain) whose ``at``-th step opens ``started`` and holds until ``release`` opens."""

    def __init__(self, started: Gate, release: Gate, at: int, env_index: int = 0) -> None:
        super().__init__(env_index=env_index)
        self.started, self.release, self.at = started, release, at

    def step(self, td: TensorDictBase) -> TensorDictBase:
        if self.steps + 1 == self.at:
            self.started.open()
            assert self.release.wait(60), "the test never released the env"
        return self._advance(td)


def hold_at_step_env_fn(started: Gate, release: Gate, at: int) -> Any:
    def make(ctx: EnvContext) -> HoldAtStepEnv:
        return HoldAtStepEnv(started, release, at, ctx.env_index)

    return make


def holding_env_fn(started: Gate, release: Gate) -> Any:
    def make(ctx: EnvContext) -> HoldingEnv:
        return HoldingEnv(started, release, ctx.env_index)

    return make


class MarkingEnv(EchoEnv):
    """EchoEnv whose step leaves a file ``stepped-<env>-<step>`` in ``directory`` when it ends."""

    def __init__(self, directory: str, env_index: int = 0) -> None:
        super().__init__(env_index=env_index)
        self.directory = directory

    def step(self, td: TensorDictBase) -> TensorDictBase:
        out = self._advance(td)
        with open(os.path.join(self.directory, f"stepped-{self.env_index}-{self.steps}"), "w"):
            pass
        return out


def marking_env_fn(directory: str) -> Any:
    def make(ctx: EnvContext) -> MarkingEnv:
        return MarkingEnv(directory, ctx.env_index)

    return make


def wait_for_files(paths: list[str], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


class OutOfBoundsEnv(EchoEnv):
    """EchoEnv whose observation space says [-1, 1], but whose steps echo the step count."""

    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float64)

    def __init__(self) -> None:
        super().__init__(fail_on_negative=False)

    def _obs(self, action: float) -> torch.Tensor:
        return torch.tensor([0.0, max(-1.0, min(1.0, action)), float(self.steps)], dtype=torch.float64)


class BadRewardEnv(EchoEnv):
    """EchoEnv whose reward space is [0, 1] while it rewards the action (up to 10)."""

    reward_space = spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = spaces.Box(0.0, 10.0, (1,), np.float64)
