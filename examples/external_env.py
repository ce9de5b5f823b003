"""Envs that connect in: CartPole simulators the trainer does not start (RLlib's external env).

The simulators here are separate processes, each running CartPole episodes and asking a
server for every action through an ``aenvs.PolicyClient``, as a robot, a game or an
LLM-agent harness outside the training job would. The trainer serves them with
``aenvs.serve`` and collects from the server's pool with the usual overlapped loop:
each client episode is an env of the pool; whichever envs are ready are stepped at
once. When it has enough episodes it closes the pool and the server; the simulators
hear so (a ``PolicyServerError``) and stop.

Run:
    python examples/external_env.py --simulators 4 --episodes 16
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import TYPE_CHECKING

import gymnasium as gym

import aenvs

if TYPE_CHECKING:  # the trainer's batches hold torch tensors; the simulators never import torch
    import torch

MAX_STEPS = 200  # a simulator's time limit: its episodes end truncated there


def simulate(url: str) -> None:
    """A simulator: CartPole episodes until the server goes away."""
    env = gym.make("CartPole-v1", max_episode_steps=MAX_STEPS)
    with aenvs.PolicyClient(
        url, observation_space=env.observation_space, action_space=env.action_space
    ) as client:
        try:
            while True:
                episode_id = client.start_episode()
                obs, _ = env.reset()
                while True:
                    action = client.get_action(episode_id, obs)
                    obs, reward, terminated, truncated, _ = env.step(action)
                    client.log_returns(episode_id, float(reward))
                    if terminated or truncated:
                        client.end_episode(episode_id, obs, truncated=bool(truncated and not terminated))
                        break
        except aenvs.PolicyServerError:
            pass  # the trainer is done


def policy(observation: torch.Tensor) -> torch.Tensor:
    """Push the cart toward where the pole falls (angle plus some of its angular velocity)."""
    return (observation[:, 2] + 0.5 * observation[:, 3] > 0).long()


async def collect(pool: aenvs.AsyncEnvPool, episodes: int) -> list[float]:
    """Step whichever envs are ready until ``episodes`` episodes ended; their returns."""
    returns: list[float] = []
    running = [0.0] * pool.num_envs
    td = await pool.reset()  # waits until every slot has a client episode
    while len(returns) < episodes:
        td["action"] = policy(td["observation"])
        await pool.async_step_and_maybe_reset_send(td)  # an episode that ends takes the next client's
        out, td = await pool.async_step_and_maybe_reset_recv(min_get=1)
        rewards, dones = out["next", "reward"].flatten().tolist(), out["next", "done"].flatten().tolist()
        for i, reward, done in zip(out["env_index"].tolist(), rewards, dones, strict=True):
            running[i] += reward
            if done:
                returns.append(running[i])
                running[i] = 0.0
    return returns[:episodes]


async def main(args: argparse.Namespace) -> None:
    obs_space = gym.make("CartPole-v1").observation_space
    server = aenvs.serve(args.simulators, obs_space, gym.spaces.Discrete(2))
    async with server:
        simulators = [
            await asyncio.create_subprocess_exec(sys.executable, __file__, "--simulate", server.url)
            for _ in range(args.simulators)
        ]
        async with server.pool() as pool:
            start = time.perf_counter()  # the simulators start meanwhile: the first reset waits for them
            returns = await collect(pool, args.episodes)
            elapsed = time.perf_counter() - start
    async with asyncio.timeout(30):
        exited = [await proc.wait() for proc in simulators]
    steps = sum(returns)  # CartPole pays 1 per step
    print(f"collected {len(returns)} episodes from {args.simulators} simulators in {elapsed:.2f} s")
    print(f"mean return: {sum(returns) / len(returns):.1f} (at most {MAX_STEPS})")
    print(f"steps/s: {steps / elapsed:,.0f}")
    print(f"simulators exited cleanly: {exited.count(0)}/{len(exited)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="CartPole simulators that connect in")
    parser.add_argument("--simulators", type=int, default=4, help="simulator processes (and env slots)")
    parser.add_argument("--episodes", type=int, default=16, help="episodes to collect")
    parser.add_argument("--simulate", metavar="URL", help=argparse.SUPPRESS)  # run as a simulator
    arguments = parser.parse_args()
    if arguments.simulate:
        simulate(arguments.simulate)
    else:
        asyncio.run(main(arguments))
