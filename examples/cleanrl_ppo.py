"""PPO on CartPole-v1 in CleanRL's single-file style, on aenvs' gymnasium vector env.

The training loop is plain gymnasium vector API code (numpy in and out, next-step
autoreset); the only aenvs line builds the vector env. ``--vector-env gymnasium``
runs the same script on gymnasium's own ``AsyncVectorEnv`` instead, for comparison:
aenvs' vector env returns the same results step for step, so under one ``--seed``
both runs learn the same curve and only the wall time differs.

    python examples/cleanrl_ppo.py                                 # aenvs, process executor
    python examples/cleanrl_ppo.py --vector-env gymnasium          # gymnasium.vector.AsyncVectorEnv
    python examples/cleanrl_ppo.py --executor thread --total-timesteps 20000

Prints a progress line every ``--curve-every`` steps, a learning curve (mean return of
the episodes finished in each such bucket), the step at which the mean return of the
last 20 episodes first reached ``--target-return`` (training stops there unless
``--no-stop-at-target``), and steps and wall time in total.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import time
import typing
from collections import deque

import gymnasium as gym
import numpy as np
import torch
from torch import nn
from torch.distributions.categorical import Categorical

from aenvs.gymnasium import AsyncVectorEnv


@dataclasses.dataclass
class Args:
    env_id: str = "CartPole-v1"
    vector_env: str = "aenvs"  # "aenvs" or "gymnasium" (gymnasium.vector.AsyncVectorEnv)
    executor: str = "process"  # aenvs executor: "inline", "thread" or "process"
    seed: int = 1
    total_timesteps: int = 500_000
    # rl-baselines3-zoo's tuned CartPole hyperparameters (CleanRL's defaults, 4 envs x 128
    # steps and 4 epochs of 4 minibatches, were not reliably at 475 within 500k steps here)
    num_envs: int = 8
    num_steps: int = 32  # steps per env per rollout
    learning_rate: float = 1e-3
    anneal_lr: bool = True
    gamma: float = 0.98
    gae_lambda: float = 0.8
    num_minibatches: int = 1
    update_epochs: int = 20
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_return: float = 475.0  # mean return over the last 20 episodes
    stop_at_target: bool = True  # stop once the target is reached (else run total_timesteps)
    curve_every: int = 10_000  # steps per learning-curve bucket
    torch_threads: int = 1  # a 64-unit MLP runs fastest on one thread

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_iterations(self) -> int:
        return self.total_timesteps // self.batch_size


def parse_args() -> Args:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    types = typing.get_type_hints(Args)  # the fields' types (annotations are strings here)
    choices = {"vector_env": ["aenvs", "gymnasium"], "executor": ["inline", "thread", "process"]}
    for field in dataclasses.fields(Args):
        flag = "--" + field.name.replace("_", "-")
        kind = types[field.name]
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=field.default)
        else:
            parser.add_argument(flag, type=kind, default=field.default, choices=choices.get(field.name))
    return Args(**vars(parser.parse_args()))


def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int) -> None:
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, n_actions), std=0.01),
        )

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(
        self, x: torch.Tensor, action: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


class Progress:
    """Episode returns as they finish: the last 20, per-bucket means, when the target was first met."""

    def __init__(self, target: float, bucket: int) -> None:
        self.target, self.bucket = target, bucket
        self.last20: deque[float] = deque(maxlen=20)
        self.buckets: dict[int, list[float]] = {}
        self.episodes = 0
        self.reached_at: int | None = None
        self.reached_time: float | None = None

    def add(self, step: int, episode_return: float, elapsed: float) -> None:
        self.episodes += 1
        self.last20.append(episode_return)
        self.buckets.setdefault(step // self.bucket, []).append(episode_return)
        if self.reached_at is None and len(self.last20) == 20 and self.mean20 >= self.target:
            self.reached_at, self.reached_time = step, elapsed

    @property
    def mean20(self) -> float:
        return float(np.mean(self.last20)) if self.last20 else float("nan")


def main() -> None:
    args = parse_args()
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.torch_threads)

    start = time.perf_counter()
    # the one env line: aenvs' vector env, or gymnasium's own for comparison
    envs = gym.wrappers.vector.RecordEpisodeStatistics(
        AsyncVectorEnv.from_id(args.env_id, args.num_envs, executor=args.executor)
        if args.vector_env == "aenvs"
        else gym.make_vec(args.env_id, args.num_envs, vectorization_mode="async")
    )
    assert isinstance(envs.single_action_space, gym.spaces.Discrete), "discrete actions only"
    obs_shape = envs.single_observation_space.shape
    assert obs_shape is not None
    agent = Agent(int(np.prod(obs_shape)), int(envs.single_action_space.n))
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    obs = torch.zeros((args.num_steps, args.num_envs, *obs_shape))
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long)
    logprobs = torch.zeros((args.num_steps, args.num_envs))
    rewards = torch.zeros((args.num_steps, args.num_envs))
    dones = torch.zeros((args.num_steps, args.num_envs))
    values = torch.zeros((args.num_steps, args.num_envs))

    progress = Progress(args.target_return, args.curve_every)
    global_step = 0
    next_obs_np, _ = envs.reset(seed=args.seed)
    next_obs = torch.as_tensor(next_obs_np)
    next_done = torch.zeros(args.num_envs)
    env_time = 0.0
    print(
        f"{args.env_id}: {args.vector_env} vector env"
        + (f" ({args.executor} executor)" if args.vector_env == "aenvs" else "")
        + f", {args.num_envs} envs, {args.total_timesteps:,} steps at most, seed {args.seed}"
    )

    try:
        for iteration in range(1, args.num_iterations + 1):
            if args.anneal_lr:
                frac = 1.0 - (iteration - 1.0) / args.num_iterations
                optimizer.param_groups[0]["lr"] = frac * args.learning_rate

            for step in range(args.num_steps):
                global_step += args.num_envs
                obs[step] = next_obs
                dones[step] = next_done
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(next_obs)
                    values[step] = value.flatten()
                actions[step] = action
                logprobs[step] = logprob

                t0 = time.perf_counter()
                next_obs_np, reward, terminations, truncations, infos = envs.step(action.numpy())
                env_time += time.perf_counter() - t0
                next_done = torch.as_tensor(np.logical_or(terminations, truncations), dtype=torch.float32)
                rewards[step] = torch.as_tensor(reward, dtype=torch.float32)
                next_obs = torch.as_tensor(next_obs_np)
                if "episode" in infos:
                    for i in np.flatnonzero(infos["_episode"]):
                        progress.add(
                            global_step, float(infos["episode"]["r"][i]), time.perf_counter() - start
                        )

            # bootstrap value if not done (next-step autoreset: a done step's next obs is a reset one)
            with torch.no_grad():
                next_value = agent.get_value(next_obs).reshape(1, -1)
                advantages = torch.zeros_like(rewards)
                lastgaelam = torch.zeros(args.num_envs)
                for t in reversed(range(args.num_steps)):
                    if t == args.num_steps - 1:
                        nextnonterminal = 1.0 - next_done
                        nextvalues = next_value
                    else:
                        nextnonterminal = 1.0 - dones[t + 1]
                        nextvalues = values[t + 1]
                    delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                    lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                    advantages[t] = lastgaelam
                returns = advantages + values

            b_obs = obs.reshape((-1, *obs_shape))
            b_logprobs = logprobs.reshape(-1)
            b_actions = actions.reshape(-1)
            b_advantages = advantages.reshape(-1)
            b_returns = returns.reshape(-1)
            b_values = values.reshape(-1)

            b_inds = np.arange(args.batch_size)
            for _epoch in range(args.update_epochs):
                np.random.shuffle(b_inds)
                for begin in range(0, args.batch_size, args.minibatch_size):
                    mb_inds = b_inds[begin : begin + args.minibatch_size]
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(
                        b_obs[mb_inds], b_actions[mb_inds]
                    )
                    ratio = (newlogprob - b_logprobs[mb_inds]).exp()
                    mb_advantages = b_advantages[mb_inds]
                    if args.norm_adv:
                        mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                    pg_loss = torch.max(
                        -mb_advantages * ratio,
                        -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef),
                    ).mean()
                    newvalue = newvalue.view(-1)
                    if args.clip_vloss:
                        v_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                        v_clipped = b_values[mb_inds] + torch.clamp(
                            newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef
                        )
                        v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_returns[mb_inds]) ** 2).mean()
                    else:
                        v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()
                    loss = pg_loss - args.ent_coef * entropy.mean() + v_loss * args.vf_coef
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                    optimizer.step()

            elapsed = time.perf_counter() - start
            reached = args.stop_at_target and progress.reached_at is not None
            bucket_done = (
                global_step // args.curve_every > (global_step - args.batch_size) // args.curve_every
            )
            if bucket_done or reached or iteration == args.num_iterations:
                print(
                    f"step {global_step:>8,}  episodes {progress.episodes:>5}  "
                    f"mean return (last 20) {progress.mean20:7.1f}  steps/s {global_step / elapsed:7.0f}"
                )
            if reached:
                break
    finally:
        envs.close()

    wall = time.perf_counter() - start
    print("learning curve (mean return of the episodes finished in each bucket):")
    for bucket, returns_in in sorted(progress.buckets.items()):
        lo, hi = bucket * args.curve_every, (bucket + 1) * args.curve_every
        print(
            f"  steps {lo:>8,}-{hi:<8,} episodes {len(returns_in):>5}  mean return {np.mean(returns_in):7.1f}"
        )
    if progress.reached_at is not None:
        print(
            f"target reached: mean return {progress.mean20:.1f} over the last 20 episodes >= "
            f"{args.target_return:g} at step {progress.reached_at:,} ({progress.reached_time:.1f} s)"
        )
    else:
        print(f"target not reached: mean return over the last 20 episodes {progress.mean20:.1f}")
    print(f"final mean return (last 20 episodes): {progress.mean20:.1f}")
    print(f"total steps: {global_step:,}  wall time: {wall:.1f} s  (in envs.step: {env_time:.1f} s)")


if __name__ == "__main__":
    main()
