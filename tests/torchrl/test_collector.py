"""The sync shim in TorchRL's collector, through aenvs.torchrl.AenvsWrapper, on every executor:
TorchRL's spec check passes, and the frames a random policy collects are exactly what the
gymnasium envs give for those actions, across batches and auto-resets."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDictBase

import aenvs
from aenvs._seeding import seed_chain
from tests.torchrl.support import collector_class, import_torchrl

pytestmark = pytest.mark.torchrl

N, FRAMES_PER_BATCH, BATCHES, SEED = 3, 3 * 25, 4, 21


def _wrapper(executor: str, seed: int | None = None):
    from aenvs.torchrl import AenvsWrapper

    return AenvsWrapper(aenvs.SerialEnv(N, lambda: gym.make("CartPole-v1"), executor=executor, seed=seed))


def test_torchrl_spec_check_passes(executor: str) -> None:
    check_env_specs = import_torchrl("torchrl.envs.utils").check_env_specs
    env = _wrapper(executor)
    try:
        assert env.batch_size == torch.Size([N])
        assert env.action_spec.dtype == torch.int64 and env.action_spec.shape == torch.Size([N])
        check_env_specs(env)
        rollout = env.rollout(30, break_when_any_done=False)
        assert rollout.batch_size == torch.Size([N, 30])
        assert "env_index" not in rollout.keys()
    finally:
        env.close()
    assert env.env.is_closed


# torchrl 0.14's collector builds its own deprecated weight updaters (nothing of ours)
@pytest.mark.filterwarnings("ignore:Creating .*WeightUpdater which inherits:DeprecationWarning")
def test_collector_frames_replay_exactly_on_gymnasium(executor: str) -> None:
    collector = collector_class()(
        _wrapper(executor, seed=SEED),
        None,  # TorchRL's RandomPolicy over the wrapper's action spec
        frames_per_batch=FRAMES_PER_BATCH,
        total_frames=FRAMES_PER_BATCH * BATCHES,
    )
    try:
        batches = [batch.clone() for batch in collector]
    finally:
        collector.shutdown()
    assert len(batches) == BATCHES
    assert all(b.batch_size == torch.Size([N, FRAMES_PER_BATCH // N]) for b in batches)
    # [N, T]: the batches follow on from each other
    trajectory: TensorDictBase = torch.cat(batches, dim=1)  # pyright: ignore[reportAssignmentType, reportArgumentType]
    actions = trajectory["action"]
    assert actions.dtype == torch.int64 and set(actions.unique().tolist()) == {0, 1}

    seeds, _ = seed_chain(SEED, N)
    episodes = new_trajectories = 0
    for k in range(N):  # replay env k's actions on a gymnasium CartPole seeded as the pool seeds it
        env = gym.make("CartPole-v1")
        obs, _ = env.reset(seed=seeds[k])
        for t in range(trajectory.batch_size[1]):
            frame = trajectory[k, t]
            np.testing.assert_array_equal(frame["observation"].numpy(), obs, err_msg=f"env {k} step {t}")
            obs, reward, terminated, truncated, _ = env.step(int(frame["action"]))
            np.testing.assert_array_equal(frame["next", "observation"].numpy(), obs)
            assert frame["next", "reward"].item() == reward
            assert frame["next", "terminated"].item() == terminated
            assert frame["next", "truncated"].item() == truncated
            if terminated or truncated:
                episodes += 1
                new_trajectories += t < trajectory.batch_size[1] - 1  # one that starts within the data
                obs, _ = env.reset()
    assert episodes >= 3  # resets happened inside and across batches
    assert trajectory["collector", "traj_ids"].unique().numel() == N + new_trajectories
