"""A PettingZoo parallel env whose agents leave mid-episode, stepped by one policy per group.

``Foragers`` has two kinds of agents on a line of cells:

* ``scout_0`` ... ``scout_3`` walk left, stay or right (Discrete(3)) looking for food at a
  cell they observe; a scout that reaches it gets +1 and leaves the episode (terminated),
  and every scout leaves, empty-handed, when its energy runs out.
* ``hauler_0`` and ``hauler_1`` choose to wait or to carry (Discrete(2)); carrying pays
  0.1 per scout still out, so it pays best early. The haulers stay until the last scout
  has left, or until ``MAX_STEPS`` ends the episode for everyone still there (truncated).

The pool lays the agents out in groups (``"scout"``, ``"hauler"``: the agents' names
before ``_<n>``): each group's observation is ``[num_envs, n_agents, obs]`` and its
``"mask"`` ``[num_envs, n_agents]`` says which agents act next. One small MLP per group
reads the group's observations and writes ``[num_envs, n_agents]`` actions; the rows of
masked agents are ignored by the pool (never passed to the env), and their rewards left
out of the returns below. The envs run on worker processes.

Run:
    python examples/multi_agent.py --steps 300 --num-envs 4
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from pettingzoo import ParallelEnv
from tensordict import TensorDictBase
from torch import nn

from aenvs import AsyncEnvPool, EnvContext

CELLS, MAX_STEPS, SCOUTS, HAULERS = 10, 40, 4, 2
SCOUT_OBS = spaces.Box(0.0, 1.0, (3,), np.float32)  # own cell, food cell, energy left
HAULER_OBS = spaces.Box(0.0, 1.0, (2,), np.float32)  # time, share of scouts still out
ACTIONS = {"scout": spaces.Discrete(3), "hauler": spaces.Discrete(2)}


class Foragers(ParallelEnv[str, np.ndarray, int]):
    """Scouts that leave when they find food or run out of energy; haulers that stay."""

    def __init__(self, seed: int = 0) -> None:
        self.metadata = {"name": "foragers_v0"}
        self.possible_agents = [f"scout_{i}" for i in range(SCOUTS)] + [f"hauler_{i}" for i in range(HAULERS)]
        self.agents: list[str] = []
        self.rng = np.random.default_rng(seed)
        self.t = 0
        self.cell = np.zeros(SCOUTS, np.int64)
        self.food = np.zeros(SCOUTS, np.int64)
        self.energy = np.zeros(SCOUTS, np.int64)

    def observation_space(self, agent: str) -> spaces.Space[Any]:
        return SCOUT_OBS if agent.startswith("scout") else HAULER_OBS

    def action_space(self, agent: str) -> spaces.Space[Any]:
        return ACTIONS[agent.split("_")[0]]

    def _scouts_out(self) -> int:
        return sum(a.startswith("scout") for a in self.agents)

    def _observe(self, agent: str) -> np.ndarray:
        kind, index = agent.split("_")
        if kind == "hauler":
            return np.array([self.t / MAX_STEPS, self._scouts_out() / SCOUTS], np.float32)
        i = int(index)
        return np.array([self.cell[i] / CELLS, self.food[i] / CELLS, self.energy[i] / MAX_STEPS], np.float32)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.agents = list(self.possible_agents)
        self.t = 0
        self.cell = self.rng.integers(0, CELLS, SCOUTS)
        self.food = self.rng.integers(0, CELLS, SCOUTS)
        self.energy = self.rng.integers(3, 15, SCOUTS)
        return {a: self._observe(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions: dict[str, int]) -> tuple[dict[str, Any], ...]:
        self.t += 1
        rewards: dict[str, float] = {}
        terminations: dict[str, bool] = {}
        for agent, action in actions.items():
            kind, index = agent.split("_")
            if kind == "scout":
                i = int(index)
                self.cell[i] = np.clip(self.cell[i] + int(action) - 1, 0, CELLS - 1)
                self.energy[i] -= 1
                found = bool(self.cell[i] == self.food[i])
                rewards[agent] = 1.0 if found else 0.0
                terminations[agent] = found or self.energy[i] <= 0
            else:
                rewards[agent] = 0.1 * self._scouts_out() * int(action)
        scouts_left = [a for a in actions if a.startswith("scout") and not terminations[a]]
        for agent in actions:
            if agent.startswith("hauler"):
                terminations[agent] = not scouts_left
        truncations = {a: self.t >= MAX_STEPS and not terminations[a] for a in actions}
        self.agents = [a for a in actions if not terminations[a] and not truncations[a]]
        observations = {a: self._observe(a) for a in actions}  # the leaving agents' last ones too
        return observations, rewards, terminations, truncations, {a: {} for a in actions}


def make_env(context: EnvContext) -> Foragers:
    return Foragers(seed=context.env_index)


class GroupPolicy(nn.Module):
    """One MLP shared by the agents of a group: ``[N, n_agents, obs]`` -> ``[N, n_agents]`` actions."""

    def __init__(self, obs_dim: int, num_actions: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, 32), nn.Tanh(), nn.Linear(32, num_actions))

    def forward(self, observation: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        logits = self.net(observation)
        actions = torch.distributions.Categorical(logits=logits).sample()
        return torch.where(mask, actions, 0)  # masked agents' rows: never passed to the env


async def main(steps: int, num_envs: int, executor: str) -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # tiny matmuls: a thread pool only adds its wake-ups
    policies = {
        "scout": GroupPolicy(SCOUT_OBS.shape[0], 3),
        "hauler": GroupPolicy(HAULER_OBS.shape[0], 2),
    }
    returns = {group: torch.zeros(num_envs) for group in policies}  # the running episodes'
    finished: dict[str, list[float]] = {group: [] for group in policies}
    started = time.perf_counter()
    async with AsyncEnvPool(make_env, num_envs=num_envs, executor=executor) as pool:
        td: TensorDictBase = await pool.reset()
        for _ in range(steps):
            with torch.no_grad():
                for group, policy in policies.items():
                    td[group, "action"] = policy(td[group, "observation"], td[group, "mask"])
            out, td = await pool.step_and_maybe_reset(td)
            for group in policies:
                # an agent that acted at this step (masked in, in the input) has its reward in
                # "next", also at the step it leaves
                reward = out["next", group, "reward"].squeeze(-1)
                returns[group] += (reward * out[group, "mask"]).sum(-1)
            done = out["next", "done"].squeeze(-1)
            for group in policies:
                finished[group].extend(returns[group][done].tolist())
                returns[group][done] = 0.0
    elapsed = time.perf_counter() - started
    print(f"steps: {steps} x {num_envs} envs on executor={executor!r} in {elapsed:.2f} s")
    print(f"episodes finished: {len(finished['scout'])}")
    for group, values in finished.items():
        mean = sum(values) / len(values) if values else float("nan")
        print(f"{group}: mean return {mean:.3f} per episode (summed over its agents)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300, help="pool steps (each steps every env)")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--executor", default="process", choices=["inline", "thread", "process", "ray"])
    args = parser.parse_args()
    asyncio.run(main(args.steps, args.num_envs, args.executor))
