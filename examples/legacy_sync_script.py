"""A TorchRL-style synchronous script, run once on ``aenvs.SerialEnv`` and once on ``aenvs.ParallelEnv``.

The three things such scripts do, written as for ``torchrl.envs.SerialEnv`` /
``ParallelEnv`` (only the import differs):

1. ``env.rollout(max_steps, policy)`` with a small torch policy: a ``[num_envs, T]``
   trajectory whose last dim is named ``"time"``;
2. a data-collection loop on ``env.step_and_maybe_reset(td)``, where envs whose
   episode ended come back already reset;
3. a partial reset: ``td["_reset"]`` marks the envs to reset, the others keep their data.

Run:
    python examples/legacy_sync_script.py --num-envs 4 --steps 200
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import torch
from tensordict import TensorDictBase
from torch import nn

from aenvs import ParallelEnv, SerialEnv, check_env_specs, step_mdp


def make_env(max_episode_steps: int = 500) -> gym.Env:
    return gym.make("CartPole-v1", max_episode_steps=max_episode_steps)


class Policy(nn.Module):
    """A small deterministic policy: observation -> logits -> the best action."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 2))

    @torch.no_grad()
    def forward(self, td: TensorDictBase) -> TensorDictBase:
        td["action"] = self.net(td["observation"]).argmax(-1)
        return td


def run(env_cls: type[SerialEnv] | type[ParallelEnv], num_envs: int, steps: int) -> None:
    torch.manual_seed(0)
    policy = Policy()
    began = time.perf_counter()
    # TorchRL's arguments: num_workers, create_env_fn, create_env_kwargs
    with env_cls(num_envs, make_env, {"max_episode_steps": 200}) as env:
        check_env_specs(env)
        next_seed = env.set_seed(0)

        # 1. a rollout with a policy (stops at the first done, as TorchRL's default)
        traj = env.rollout(steps, policy)
        print(
            f"  rollout: batch {tuple(traj.batch_size)}, dims {traj.names}, "
            f"first episode end after {traj.batch_size[1]} steps"
        )
        traj = env.rollout(steps, policy, break_when_any_done=False)
        print(
            f"  rollout without stopping: {int(traj['next', 'done'].sum())} episodes ended in {steps} steps"
        )

        # 2. collecting with step_and_maybe_reset
        td = env.reset()
        rewards, episodes = 0.0, 0
        for _ in range(steps):
            td = env.rand_action(td)
            out, td = env.step_and_maybe_reset(td)
            rewards += float(out["next", "reward"].sum())
            episodes += int(out["next", "done"].sum())
        print(f"  step_and_maybe_reset: {steps * num_envs} steps, {episodes} episodes, reward {rewards:.0f}")

        # 3. a partial reset: only the envs marked are reset
        td = step_mdp(env.rand_step(env.reset()))
        before = td["observation"].clone()
        td["_reset"] = torch.arange(num_envs).remainder(2).eq(0).unsqueeze(-1)  # envs 0, 2, ...
        td = env.reset(td)
        kept = [i for i in range(num_envs) if torch.equal(td["observation"][i], before[i])]
        print(f"  partial reset of envs {list(range(0, num_envs, 2))}: envs {kept} kept their observation")

        print(f"  gravity of every env: {env.gravity}; next seed in the chain: {next_seed}")
    print(f"  {env_cls.__name__} done in {time.perf_counter() - began:.2f} s")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=int, default=4, help="envs per batched env (default: 4)")
    parser.add_argument("--steps", type=int, default=200, help="steps per loop (default: 200)")
    args = parser.parse_args(argv)
    for env_cls in (SerialEnv, ParallelEnv):
        print(f"{env_cls.__name__}({args.num_envs}, make_env):")
        run(env_cls, args.num_envs, args.steps)


if __name__ == "__main__":  # process pools (ParallelEnv) need the guard
    main()
