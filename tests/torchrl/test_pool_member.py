"""A TorchRL env as one of a pool's envs, on every executor: it steps exactly as TorchRL steps
it, laid out like the gymnasium env it wraps."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from aenvs import EnvError
from tests.torchrl.support import import_torchrl

pytestmark = pytest.mark.torchrl

N, STEPS, SEED = 3, 80, 11


def _torchrl_cartpole():
    return import_torchrl("torchrl.envs").GymEnv("CartPole-v1")


def _torchrl_pendulum():
    return import_torchrl("torchrl.envs").PendulumEnv()


async def _run(pool, actions: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    await pool.set_seed(SEED)
    td = await pool.reset()
    records = [{"observation": td["observation"].clone()}]
    for t in range(len(actions)):
        td["action"] = actions[t]
        out, td = await pool.step_and_maybe_reset(td)
        records.append(
            {
                "next_observation": out["next", "observation"].clone(),
                "reward": out["next", "reward"].clone(),
                "terminated": out["next", "terminated"].clone(),
                "truncated": out["next", "truncated"].clone(),
                "observation": td["observation"].clone(),  # after the auto-reset
            }
        )
    return records


async def test_a_torchrl_env_steps_as_the_gymnasium_env_it_wraps(make_pool) -> None:
    import_torchrl()
    actions = torch.randint(0, 2, (STEPS, N), generator=torch.Generator().manual_seed(5))
    theirs = await make_pool([_torchrl_cartpole] * N)
    ours = await make_pool([lambda: gym.make("CartPole-v1")] * N)
    # TorchRL's CartPole takes one-hot actions: in the pool, indices, as for gymnasium envs
    assert theirs.env_specs[0].action_space == gym.spaces.Discrete(2)
    assert [leaf.key for leaf in theirs.env_specs[0].step_leaves] == [
        leaf.key for leaf in ours.env_specs[0].step_leaves
    ]
    a, b = await _run(theirs, actions), await _run(ours, actions)
    assert sum(bool(r["terminated"].any()) for r in a[1:]) >= 3  # episodes end and auto-reset
    for t, (x, y) in enumerate(zip(a, b, strict=True)):
        for key in x:
            assert x[key].dtype == y[key].dtype, (t, key)
            assert torch.equal(x[key], y[key]), f"step {t}: {key} differs\n{x[key]}\n{y[key]}"


async def test_a_stateless_torchrl_env_gets_its_state_back_each_step(make_pool) -> None:
    """TorchRL's PendulumEnv reads its state (th, thdot, params) from the input TensorDict:
    the pool feeds it its last output, as TorchRL's own rollout does."""
    envs = import_torchrl("torchrl.envs")
    step_mdp = import_torchrl("torchrl.envs.utils").step_mdp
    actions = torch.rand(40, 2, 1, generator=torch.Generator().manual_seed(3)) * 4 - 2
    expected = []
    for i in range(2):
        env = envs.PendulumEnv()
        env.set_seed(SEED + i)
        td = env.reset()
        rows = []
        for t in range(len(actions)):
            td["action"] = actions[t, i]
            out = env.step(td)
            rows.append((out["next", "th"].item(), out["next", "reward"].item()))
            td = step_mdp(out, keep_other=True)
        expected.append(rows)

    pool = await make_pool([_torchrl_pendulum] * 2)
    td = await pool.reset(seed=[SEED, SEED + 1])  # each env: set_seed, then reset, as above
    got: list[list[tuple[float, float]]] = [[], []]
    for t in range(len(actions)):
        td["action"] = actions[t]
        out = await pool.step(td)
        for i in range(2):
            got[i].append((out["next", "th"][i].item(), out["next", "reward"][i].item()))
    assert got == expected


async def test_a_batched_torchrl_env_is_refused_naming_the_env(make_pool) -> None:
    envs = import_torchrl("torchrl.envs")

    def batched():
        return envs.SerialEnv(2, lambda: envs.GymEnv("CartPole-v1"))

    with pytest.raises(EnvError, match=r"batch size \[\]") as info:
        await make_pool([lambda: gym.make("CartPole-v1"), batched])
    assert info.value.env_index == 1
