"""Timeouts that truncate, through aenvs.torchrl.AenvsWrapper, on every executor: the
wrapper's done specs have ``"timed_out"`` (TorchRL's spec check passes), and a step past
the episode deadline comes out done, truncated and timed out."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch

import aenvs
from tests.torchrl.support import import_torchrl
from tests.torchrl.test_wrapper_partial_steps import Counting

pytestmark = pytest.mark.torchrl

N = 2
DEADLINE = 0.2


def _wrapper(executor: str, **options: Any) -> Any:
    from aenvs.torchrl import AenvsWrapper

    fns = [lambda k=k: Counting(offset=10.0 * (k + 1)) for k in range(N)]
    return AenvsWrapper(aenvs.SerialEnv(N, fns, executor=executor, **options))


def test_a_truncating_env_has_the_timed_out_flag_in_its_done_specs(executor: str) -> None:
    check_env_specs = import_torchrl("torchrl.envs.utils").check_env_specs
    env = _wrapper(executor, on_timeout="truncate", episode_timeout=DEADLINE)
    try:
        assert set(env.done_keys) == {"done", "terminated", "truncated", "timed_out"}
        assert env.full_done_spec["timed_out"].shape == torch.Size([N, 1])
        check_env_specs(env)
        td = env.reset()
        since = time.perf_counter()
        assert td["timed_out"].flatten().tolist() == [False] * N
        out = env.step(env.rand_action(td))
        assert out["next", "timed_out"].flatten().tolist() == [False] * N
        while time.perf_counter() - since < DEADLINE:  # the clock itself: the deadline must pass
            time.sleep(DEADLINE / 4)
        out = env.step(env.rand_action(td))
        for key in ("timed_out", "truncated", "done"):
            assert out["next", key].flatten().tolist() == [True] * N, key
        assert out["next", "terminated"].flatten().tolist() == [False] * N
        assert out["next", "observation"][:, 0].tolist() == [11.0, 21.0]  # where the episode was cut
    finally:
        env.close()


def test_an_env_that_raises_on_timeouts_has_no_timed_out_flag(executor: str) -> None:
    env = _wrapper(executor, episode_timeout=30.0)
    try:
        assert set(env.done_keys) == {"done", "terminated", "truncated"}
        assert "timed_out" not in env.rollout(3).keys(include_nested=True)
    finally:
        env.close()
