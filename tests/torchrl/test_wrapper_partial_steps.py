"""Partial steps through aenvs.torchrl.AenvsWrapper, on every executor: the envs a ``"_step"``
mask leaves out keep their input values under ``"next"`` (the reference's rule), and are
not stepped."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

import aenvs
from tests.torchrl.support import import_torchrl

pytestmark = pytest.mark.torchrl

N = 3


class Counting(gym.Env):
    """Observes ``[offset + steps taken]``; its episode ends after ``ends_at`` steps."""

    observation_space = gym.spaces.Box(-1e6, 1e6, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, offset: float, ends_at: int = 100) -> None:
        self.offset, self.ends_at, self.t = offset, ends_at, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.offset + self.t], np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict]:
        self.t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return self._obs(), 1.0, self.t >= self.ends_at, False, {}


def _wrapper(executor: str, ends_at: list[int] | None = None) -> Any:
    from aenvs.torchrl import AenvsWrapper

    ends = ends_at or [100] * N
    fns = [lambda k=k: Counting(offset=10.0 * (k + 1), ends_at=ends[k]) for k in range(N)]
    return AenvsWrapper(aenvs.SerialEnv(N, fns, executor=executor))


def test_envs_left_out_of_a_step_keep_their_input(executor: str) -> None:
    step_mdp = import_torchrl("torchrl.envs.utils").step_mdp
    env = _wrapper(executor)
    try:
        td = step_mdp(env.step(env.rand_action(env.reset())))  # observations [11, 21, 31], no reward
        td = env.rand_action(td)
        td["_step"] = torch.tensor([True, False, True])
        out = env.step(td)
        assert out["next", "observation"][:, 0].tolist() == [12.0, 21.0, 32.0]  # env 1: its input
        assert out["next", "reward"][:, 0].tolist() == [1.0, 0.0, 1.0]  # absent from the input: 0
        assert not out["next", "done"].any()
        assert "_step" not in out["next"].keys()  # (TorchRL's step leaves the input's at the root)
        out = env.step(env.rand_action(step_mdp(out.exclude("_step"))))  # env 1 was not stepped
        assert out["next", "observation"][:, 0].tolist() == [13.0, 22.0, 33.0]
    finally:
        env.close()


def test_rollout_until_all_done_keeps_finished_envs_as_they_ended(executor: str) -> None:
    """TorchRL's rollout with break_when_all_done steps only the envs not done yet (a "_step"
    mask): the envs done early keep their last observation and done flags, in what the
    rollout's callback sees between steps as in the trajectory."""
    import_torchrl()
    env = _wrapper(executor, ends_at=[2, 4, 3])
    seen: list[list[float]] = []

    def callback(_, td) -> None:  # the input of the next step
        seen.append(td["observation"][:, 0].tolist())

    try:
        rollout = env.rollout(10, callback=callback, break_when_any_done=False, break_when_all_done=True)
        assert seen == [[11.0, 21.0, 31.0], [12.0, 22.0, 32.0], [12.0, 23.0, 33.0]]
        assert rollout.batch_size == torch.Size([N, 4])
        assert rollout["next", "observation"][:, :, 0].tolist() == [
            [11.0, 12.0, 12.0, 12.0],
            [21.0, 22.0, 23.0, 24.0],
            [31.0, 32.0, 33.0, 33.0],
        ]
        assert rollout["next", "done"][:, :, 0].tolist() == [
            [False, True, True, True],
            [False, False, False, True],
            [False, False, True, True],
        ]
    finally:
        env.close()
