"""Train an actor-critic (A2C with GAE) on CartPole-v1 inside an asyncio loop.

Every env step is awaited: ``out, td = await pool.step_and_maybe_reset(td)``
returns the transition in TorchRL's layout (inputs at the root, results under
``"next"``) and the input of the next step, where envs whose episode ended are
already reset. Nothing else here is specific to aenvs.

Run:
    python examples/asyncio_training_loop.py --total-steps 40000 --num-envs 8 --executor inline
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.distributions import Categorical

from aenvs import AsyncEnvPool


@dataclass
class Args:
    env_id: str = field(default="CartPole-v1", metadata={"help": "gymnasium id (Box obs, Discrete actions)"})
    total_steps: int = field(default=40_000, metadata={"help": "env steps to train for (summed over envs)"})
    num_envs: int = field(default=8, metadata={"help": "envs in the pool"})
    executor: str = field(
        default="inline", metadata={"help": "where the envs run", "choices": ["inline", "thread", "process"]}
    )
    rollout: int = field(default=16, metadata={"help": "steps per env between two updates"})
    lr: float = field(default=2.5e-3, metadata={"help": "Adam learning rate"})
    gamma: float = field(default=0.99, metadata={"help": "discount"})
    gae_lambda: float = field(default=0.95, metadata={"help": "GAE lambda"})
    ent_coef: float = field(default=0.01, metadata={"help": "entropy bonus"})
    vf_coef: float = field(default=0.5, metadata={"help": "value loss weight"})
    seed: int = field(default=1, metadata={"help": "seeds torch and the envs"})


def parse_args(argv: list[str] | None = None) -> Args:
    """One ``--flag`` per field of :class:`Args`."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for f in dataclasses.fields(Args):
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            type=type(f.default),
            default=f.default,
            choices=f.metadata.get("choices"),
            help=f"{f.metadata['help']} (default: {f.default})",
        )
    return Args(**vars(parser.parse_args(argv)))


class ActorCritic(nn.Module):
    """Two 2-layer MLPs: action logits and state value."""

    def __init__(self, obs_dim: int, num_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.actor = nn.Sequential(
            nn.Linear(obs_dim, hidden),
            nn.Tanh(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, num_actions),
        )
        self.critic = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, 1)
        )

    def dist(self, obs: torch.Tensor) -> Categorical:
        return Categorical(logits=self.actor(obs), validate_args=False)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)


async def train(args: Args) -> float:
    """Train; print progress; return the mean return of the last 20 finished episodes."""
    torch.manual_seed(args.seed)
    async with AsyncEnvPool(
        args.env_id, num_envs=args.num_envs, executor=args.executor, seed=args.seed
    ) as pool:
        spec = pool.env_specs[0]
        obs_dim = int(np.prod(spec.observation_space.shape or (1,)))
        assert isinstance(spec.action_space, spaces.Discrete), "this agent needs a Discrete action space"
        num_actions = int(spec.action_space.n)
        agent = ActorCritic(obs_dim, num_actions)
        optimizer = torch.optim.Adam(agent.parameters(), lr=args.lr)

        T, N = args.rollout, args.num_envs
        obs = torch.zeros(T, N, obs_dim)
        next_obs = torch.zeros(T, N, obs_dim)
        actions = torch.zeros(T, N, dtype=torch.long)
        rewards = torch.zeros(T, N)
        terminated = torch.zeros(T, N, dtype=torch.bool)
        done = torch.zeros(T, N, dtype=torch.bool)

        episode_return = torch.zeros(N)
        finished_returns: deque[float] = deque(maxlen=20)
        num_updates = max(1, args.total_steps // (T * N))
        global_step, started = 0, time.perf_counter()

        td = await pool.reset()
        for update in range(1, num_updates + 1):
            # 1. collect a rollout of T steps in each env, awaiting every step
            for t in range(T):
                obs[t] = td["observation"]
                with torch.no_grad():
                    actions[t] = agent.dist(obs[t]).sample()
                td["action"] = actions[t]
                out, td = await pool.step_and_maybe_reset(td)
                next_obs[t] = out["next", "observation"]  # the last observation, even where td was reset
                rewards[t] = out["next", "reward"].squeeze(-1)
                terminated[t] = out["next", "terminated"].squeeze(-1)
                done[t] = out["next", "done"].squeeze(-1)

                episode_return += rewards[t]
                finished_returns.extend(episode_return[done[t]].tolist())
                episode_return[done[t]] = 0.0
                global_step += N

            # 2. advantages with GAE; truncated episodes bootstrap from their last observation
            with torch.no_grad():
                values = agent.value(obs)
                next_values = agent.value(next_obs) * ~terminated
                advantages = torch.zeros(T, N)
                gae = torch.zeros(N)
                for t in reversed(range(T)):
                    delta = rewards[t] + args.gamma * next_values[t] - values[t]
                    gae = delta + args.gamma * args.gae_lambda * ~done[t] * gae
                    advantages[t] = gae
                returns = advantages + values

            # 3. one gradient step on the whole rollout
            dist = agent.dist(obs)
            policy_loss = -(dist.log_prob(actions) * advantages).mean()
            value_loss = (agent.value(obs) - returns).pow(2).mean()
            entropy = dist.entropy().mean()
            loss = policy_loss + args.vf_coef * value_loss - args.ent_coef * entropy
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), 0.5)
            optimizer.step()

            if update % max(1, num_updates // 10) == 0 or update == num_updates:
                mean_return = np.mean(finished_returns) if finished_returns else float("nan")
                print(
                    f"step {global_step:>7}  mean return (last 20 episodes) {mean_return:7.1f}  "
                    f"loss {loss.item():7.3f}  steps/s {global_step / (time.perf_counter() - started):7.0f}",
                    flush=True,
                )

    final = float(np.mean(finished_returns)) if finished_returns else float("nan")
    print(f"final mean return (last 20 episodes): {final:.1f}")
    print(f"steps/s: {global_step / (time.perf_counter() - started):.0f}")
    return final


if __name__ == "__main__":
    torch.set_num_threads(1)  # tiny MLPs: extra threads only contend with the envs for the cores
    asyncio.run(train(parse_args()))
