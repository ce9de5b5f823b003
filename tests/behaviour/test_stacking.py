"""Dense and lazy stacking, every gymnasium space kind, and info dicts."""

from __future__ import annotations

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase, lazy_stack

from aenvs import AsyncEnvPool, EnvSpec
from aenvs.testing import echo_env_fns
from tests.helpers import RichSpacesEnv, actions


def random_actions(specs: list[EnvSpec]) -> TensorDictBase:
    """One action per env, drawn from that env's own action space."""
    tds = []
    for spec in specs:
        sample = spec.action_space.sample()
        tds.append(TensorDict(action=torch.as_tensor(sample)))
    return lazy_stack(tds)


@pytest.mark.parametrize("stack", ["lazy", "auto"])
async def test_cartpole_and_pendulum_share_a_lazy_pool(make_pool, stack: str) -> None:
    pool = await make_pool(["CartPole-v1", "Pendulum-v1"], stack=stack)
    assert not pool.is_dense
    td = await pool.reset()
    assert isinstance(td, LazyStackedTensorDict)
    assert td[0]["observation"].shape == (4,) and td[1]["observation"].shape == (3,)
    for t, a in zip(td.tensordicts, random_actions(pool.env_specs).tensordicts, strict=True):
        t["action"] = a["action"]
    assert td[0]["action"].dtype == torch.int64 and td[1]["action"].dtype == torch.float32
    out = await pool.step(td)
    assert out[0]["next", "observation"].shape == (4,)
    assert out[1]["next", "observation"].shape == (3,)
    assert out["next", "reward"].shape == (2, 1)
    assert torch.equal(out[1]["action"], td[1]["action"])
    out, nxt = await pool.step_and_maybe_reset(td)
    assert nxt[1]["observation"].shape == (3,)
    await pool.async_step_send(td)
    got = await pool.async_step_recv(min_get=2)
    assert got["env_index"].tolist() == [0, 1]


async def test_dense_stack_of_different_envs_names_the_difference(executor: str) -> None:
    pool = AsyncEnvPool(["CartPole-v1", "Pendulum-v1"], executor=executor, stack="dense")
    with pytest.raises(ValueError, match=r"env 1 differs from env 0: key 'action'"):
        await pool.start()
    assert pool.is_closed


async def test_homogeneous_pool_is_dense_unless_asked(make_pool) -> None:
    dense = await make_pool(echo_env_fns(2))
    lazy = await make_pool(echo_env_fns(2), stack="lazy")
    a, b = await dense.reset(), await lazy.reset()
    assert type(a) is TensorDict and isinstance(b, LazyStackedTensorDict)
    assert torch.equal(a["observation"], b["observation"])
    out = await lazy.step(actions([2, 3]))
    assert isinstance(out, LazyStackedTensorDict)
    assert out["next", "observation"][:, 1].tolist() == [2.0, 3.0]


async def test_dict_tuple_multidiscrete_multibinary_spaces(make_pool) -> None:
    pool = await make_pool([RichSpacesEnv, RichSpacesEnv])
    td = await pool.reset()
    assert td["position"].shape == (2, 2) and td["position"].dtype == torch.float32
    assert td["mode"].shape == (2,) and td["mode"].dtype == torch.int64
    assert td["flags"].shape == (2, 4) and td["flags"].dtype == torch.int8
    assert td["pair", "0"].dtype == torch.int64 and td["pair", "1"].shape == (2, 3)
    assert td["pair", "1"].dtype == torch.float64
    td["action", "move"] = torch.full((2, 2), 0.25)
    td["action", "pick"] = torch.tensor([[2, 3], [0, 1]])
    out = await pool.step(td)
    assert out["next", "reward"].squeeze(-1).tolist() == [0.5, 0.5]
    assert out["next", "position"][:, 0].tolist() == pytest.approx([0.1, 0.1])
    assert out["next", "flags"][:, 3].tolist() == [1, 1]
    assert out["next", "info", "pick"].tolist() == [[2, 3], [0, 1]]  # the action reached the env
    with pytest.raises(ValueError, match=r"'action.pick' has shape \(3,\)"):
        td["action", "pick"] = torch.zeros(2, 3, dtype=torch.int64)
        await pool.async_step_send(td)


async def test_info_numeric_entries_are_tensors_and_the_rest_is_kept(make_pool) -> None:
    pool = await make_pool([RichSpacesEnv, RichSpacesEnv])
    td = await pool.reset()
    assert td["info", "level"].tolist() == [1, 1]
    assert td["info", "msg"] == ["hello", "hello"]
    td["action", "move"] = torch.zeros(2, 2)
    td["action", "pick"] = torch.zeros(2, 2, dtype=torch.int64)
    out = await pool.step(td)
    assert out["next", "info", "speed"].dtype == torch.float32
    assert out["next", "info", "speed"].tolist() == [0.5, 0.5]
    assert out["next", "info", "msg"] == ["step 1", "step 1"]


async def test_infos_that_differ_between_envs_lose_nothing(make_pool) -> None:
    import gymnasium as gym
    import numpy as np

    class Chatty(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (1,), np.float32)
        action_space = gym.spaces.Discrete(2)

        def __init__(self, name: str) -> None:
            self.name = name

        def reset(self, *, seed=None, options=None):
            return np.zeros(1, np.float32), {}

        def step(self, action):
            info = {"who": self.name} if self.name == "a" else {"score": 3}
            return np.zeros(1, np.float32), 0.0, False, False, info

    pool = await make_pool([lambda: Chatty("a"), lambda: Chatty("b")])
    td = await pool.reset()
    assert "info" not in td.keys()
    td["action"] = torch.tensor([0, 1])
    out = await pool.step(td)
    info = out["next", "info"]
    assert info[0]["who"] == "a"
    assert info[1]["score"].item() == 3
