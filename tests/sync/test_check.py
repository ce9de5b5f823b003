"""check_env_specs: a short rollout checked against every env's spaces; random actions."""

from __future__ import annotations

from typing import cast

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDictBase

from aenvs import SerialEnv, check_env_specs
from aenvs._check import EnvSpecError
from aenvs._sampling import random_actions
from aenvs.testing import EchoEnv
from tests.helpers import RichSpacesEnv
from tests.sync.sync_envs import BadRewardEnv, OutOfBoundsEnv, ValEnv


def test_good_envs_pass(executor: str) -> None:
    with SerialEnv(2, lambda: gym.make("CartPole-v1"), executor=executor) as env:
        check_env_specs(env, seed=0)
    with SerialEnv(2, ValEnv, executor=executor) as env:
        check_env_specs(env, max_steps=5)
    with SerialEnv(2, RichSpacesEnv, executor=executor) as env:
        check_env_specs(env, max_steps=6)  # Dict / Tuple / MultiDiscrete / MultiBinary, episodes of 5


def test_out_of_bounds_observation_names_the_env_and_key(executor: str) -> None:
    with SerialEnv(2, [lambda: EchoEnv(fail_on_negative=False), OutOfBoundsEnv], executor=executor) as env:
        with pytest.raises(
            EnvSpecError, match=r"env 1 .*'observation' in the step output .* out of its space"
        ) as info:
            check_env_specs(env, max_steps=3)
        assert isinstance(info.value, AssertionError)
        assert "value 2 at index [2]" in str(info.value)


def test_reward_out_of_its_space(executor: str) -> None:
    def make() -> BadRewardEnv:
        return BadRewardEnv(fail_on_negative=False)

    with (
        SerialEnv(1, make, executor=executor) as env,
        pytest.raises(EnvSpecError, match=r"env 0 .*'reward'.* out of its space"),
    ):
        torch.manual_seed(0)
        check_env_specs(env, max_steps=10)


def test_random_actions_follow_the_spaces() -> None:
    generator = torch.Generator().manual_seed(0)
    space = spaces.Dict(
        {
            "move": spaces.Box(-1, 1, (2,), np.float32),
            "free": spaces.Box(-np.inf, np.inf, (3,), np.float64),
            "half": spaces.Box(0, np.inf, (2,), np.float32),
            "count": spaces.Box(0, 4, (2,), np.int64),
            "pick": spaces.MultiDiscrete([3, 4]),
            "flags": spaces.MultiBinary(3),
            "mode": spaces.Discrete(3, start=2),
            "pair": spaces.Tuple((spaces.Discrete(2), spaces.Box(0, 1, (1,), np.dtype("bool")))),  # pyright: ignore[reportCallIssue, reportArgumentType]
        }
    )
    td = random_actions([space] * 64, generator=generator)
    action = cast(TensorDictBase, td["action"])
    assert td.batch_size == (64,)
    assert action["move"].dtype == torch.float32 and action["move"].abs().max() <= 1
    assert action["half"].min() >= 0
    assert action["count"].dtype == torch.int64 and set(action["count"].unique().tolist()) <= set(range(5))
    assert (action["pick"] < torch.tensor([3, 4])).all() and action["pick"].dtype == torch.int64
    assert action["flags"].dtype == torch.int8 and set(action["flags"].unique().tolist()) <= {0, 1}
    assert set(action["mode"].unique().tolist()) <= {2, 3, 4}
    assert action["pair", "1"].dtype == torch.bool
    for i in range(64):
        sample = {k: v for k, v in cast(TensorDictBase, action[i]).to_dict().items() if k != "pair"}
        assert space["pick"].contains(sample["pick"].numpy())
    lazy = random_actions([spaces.Discrete(2), spaces.Box(-1, 1, (2,))], dense=False)
    assert cast(TensorDictBase, lazy[1])["action"].shape == (2,)
    assert cast(TensorDictBase, lazy[0])["action"].shape == ()
