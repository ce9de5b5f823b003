"""torch's intra-op threads beside a pool of worker processes: a small MLP policy's loop.

A data-collection loop: N CartPole-v1 envs in worker processes, and in this process a
CleanRL-style PPO agent (actor and critic, each an MLP 4-64-64 with tanh; the action
sampled from a categorical distribution, its log-probability, entropy and value computed;
no gradient) that picks each batch's actions from its observations. The same loop runs with torch's default number of intra-op threads (one per
core) and with ``torch.set_num_threads(1)``, alternately, for aenvs's gymnasium vector env
on the process executor and for gymnasium's ``AsyncVectorEnv``. Beside them, the policy
alone on a batch of N observations (no envs stepping), both ways.

On a machine with few cores the workers and torch's threads want the same cores: a
thread of torch's pool that waits for work spins (OpenMP) on a core a worker needs.

    python benchmarks/torch_threads.py [--num-envs 8] [--duration 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch

from aenvs.gymnasium import AsyncVectorEnv

ENV_ID = "CartPole-v1"


def make_env() -> gym.Env:
    return gym.make(ENV_ID)


def mlp(out: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(4, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, out),
    )


def policy() -> Callable[[np.ndarray], np.ndarray]:
    """What a PPO rollout computes per batch (CleanRL's ``get_action_and_value``)."""
    torch.manual_seed(0)
    actor, critic = mlp(2), mlp(1)

    @torch.no_grad()
    def act(obs: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(obs).float()
        dist = torch.distributions.Categorical(logits=actor(x))
        action = dist.sample()
        dist.log_prob(action)  # what the rollout keeps for the update
        dist.entropy()
        critic(x)
        return action.numpy()

    return act


def loop_rate(envs: gym.vector.VectorEnv, act: Callable[[np.ndarray], np.ndarray], duration: float) -> float:
    """Env steps per second of ``obs -> policy -> envs.step`` for ``duration`` seconds."""
    obs, _ = envs.reset(seed=0)
    for _ in range(50):  # warm-up
        obs, *_ = envs.step(act(obs))
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < duration:
        for _ in range(20):
            obs, *_ = envs.step(act(obs))
        steps += 20 * envs.num_envs
    return steps / elapsed


def policy_rate(act: Callable[[np.ndarray], np.ndarray], n: int, duration: float) -> float:
    """Policy calls per second on a batch of ``n`` observations, nothing else running."""
    obs = np.random.default_rng(0).standard_normal((n, 4)).astype(np.float32)
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < duration:
        for _ in range(100):
            act(obs)
        calls += 100
    return calls / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    parser.add_argument("--repeats", type=int, default=5, help="alternating runs of each setting")
    args = parser.parse_args()

    default = torch.get_num_threads()
    settings = {f"torch default ({default} threads)": default, "torch.set_num_threads(1)": 1}
    act = policy()
    systems: dict[str, Callable[[], gym.vector.VectorEnv]] = {
        "aenvs.gymnasium.AsyncVectorEnv, process": lambda: AsyncVectorEnv(
            [make_env] * args.num_envs, executor="process"
        ),
        "gymnasium AsyncVectorEnv": lambda: gym.vector.AsyncVectorEnv([make_env] * args.num_envs),
    }
    alone = f"the policy alone, batch of {args.num_envs} (calls/s)"
    load = os.getloadavg()[0]
    results: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for label, threads in settings.items():
            torch.set_num_threads(threads)
            results.setdefault((alone, label), []).append(policy_rate(act, args.num_envs, args.duration))
    for name, build in systems.items():
        envs = build()
        try:
            for _ in range(args.repeats):
                for label, threads in settings.items():
                    torch.set_num_threads(threads)
                    results.setdefault((name, label), []).append(loop_rate(envs, act, args.duration))
        finally:
            envs.close()

    print(
        f"N = {args.num_envs} {ENV_ID}, {os.cpu_count()} cores, load average {load:.1f} before, "
        f"{os.getloadavg()[0]:.1f} after; env steps/s, median (min-max) of {args.repeats} alternating runs"
    )
    print(f"| loop | {' | '.join(settings)} | ratio of medians |")
    print("|---|" + "---:|" * (len(settings) + 1))
    for name in [alone, *systems]:
        runs = [results[(name, label)] for label in settings]
        cells = " | ".join(f"{statistics.median(r):,.0f} ({min(r):,.0f}-{max(r):,.0f})" for r in runs)
        ratio = statistics.median(runs[-1]) / statistics.median(runs[0])
        print(f"| {name} | {cells} | {ratio:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
