"""Against TorchRL itself: the same seeded random-action run through torchrl.envs.SerialEnv and
aenvs.SerialEnv on CartPole-v1 gives equal observations, rewards and done flags, step for step."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
import torch

import aenvs
from aenvs._seeding import seed_chain
from tests.torchrl.support import import_torchrl

pytestmark = pytest.mark.torchrl

N, STEPS, SEED = 3, 150, 7


def _actions() -> torch.Tensor:
    generator = torch.Generator().manual_seed(1234)
    return torch.randint(0, 2, (STEPS, N), generator=generator)


def _run_torchrl(actions: torch.Tensor) -> list[dict[str, torch.Tensor]]:
    torchrl_envs = import_torchrl("torchrl.envs")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        env = torchrl_envs.SerialEnv(N, lambda: torchrl_envs.GymEnv("CartPole-v1"))
        try:
            assert env.set_seed(SEED) == seed_chain(SEED, N)[1]
            td = env.reset()
            records = [{"observation": td["observation"].clone()}]
            for t in range(STEPS):
                td["action"] = torch.nn.functional.one_hot(actions[t], 2)  # TorchRL's CartPole is one-hot
                out, td = env.step_and_maybe_reset(td)
                records.append(_record(out, td))
            return records
        finally:
            env.close()


def _run_aenvs(actions: torch.Tensor, executor: str) -> list[dict[str, torch.Tensor]]:
    with aenvs.SerialEnv(N, lambda: gym.make("CartPole-v1"), executor=executor) as env:
        assert env.set_seed(SEED) == seed_chain(SEED, N)[1]
        td = env.reset()
        records = [{"observation": td["observation"].clone()}]
        for t in range(STEPS):
            td["action"] = actions[t]
            out, td = env.step_and_maybe_reset(td)
            records.append(_record(out, td))
        return records


def _record(out, td) -> dict[str, torch.Tensor]:
    return {
        "next_observation": out["next", "observation"].clone(),
        "reward": out["next", "reward"].clone(),
        "done": out["next", "done"].clone(),
        "terminated": out["next", "terminated"].clone(),
        "truncated": out["next", "truncated"].clone(),
        "observation": td["observation"].clone(),  # after the auto-reset
    }


@pytest.mark.parametrize("executor", ["inline", "process"])
def test_same_trajectories_as_torchrl_serial_env(executor: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # importing torchrl sets tensordict's LAZY_LEGACY_OP option in os.environ (what it sets,
    # "False"): have the variable put back as it was when the test ends
    monkeypatch.setenv("LAZY_LEGACY_OP", "False")
    actions = _actions()
    theirs = _run_torchrl(actions)
    ours = _run_aenvs(actions, executor)
    assert sum(bool(r["done"].any()) for r in theirs[1:]) > 3  # several episodes end (and auto-reset)
    for t, (a, b) in enumerate(zip(theirs, ours, strict=True)):
        for key in a:
            assert a[key].dtype == b[key].dtype, (t, key)
            assert torch.equal(a[key], b[key]), f"step {t}: {key} differs\n{a[key]}\n{b[key]}"
