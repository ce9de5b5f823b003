"""What a native env's step result costs: three forms of the same result, side by side.

The same fast native env (no work in its step) returns its observation and the step
scalars as
- a plain dict of a numpy observation: the runner writes it straight into the buffers;
- the same dict with the observation as a (prebuilt) torch tensor: the general path
  (entries normalised to arrays, then written), at the same cost to the env;
- a TensorDict built per step: the general path, plus the env's own TensorDict.
Each row steps N envs in lockstep (``pool.step``) on the inline executor for
``--duration`` seconds after a warm-up; ratios are the plain dict's steps/s over the others'.

    python benchmarks/native_results.py [--n 64] [--duration 3] [--rounds 3]
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
import torch
import uvloop
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from aenvs import AsyncEnvPool, Env

OBSERVATION = np.zeros(4, np.float32)
OBSERVATION_TENSOR = torch.from_numpy(OBSERVATION)


class PlainDictEnv(Env):
    """Returns a plain dict: the runner writes it without the general path."""

    observation_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> TensorDictBase:
        return TensorDict(observation=torch.from_numpy(OBSERVATION))

    def step(self, td: TensorDictBase) -> dict[str, Any]:  # pyright: ignore[reportIncompatibleMethodOverride]
        return {"observation": OBSERVATION, "reward": 1.0, "terminated": False}


class TensorObservationEnv(PlainDictEnv):
    """The same plain dict, its observation a torch tensor: the general path."""

    def step(self, td: TensorDictBase) -> dict[str, Any]:  # pyright: ignore[reportIncompatibleMethodOverride]
        return {"observation": OBSERVATION_TENSOR, "reward": 1.0, "terminated": False}


class TensorDictEnv(PlainDictEnv):
    """The same result as a TensorDict."""

    def step(self, td: TensorDictBase) -> TensorDictBase:  # pyright: ignore[reportIncompatibleMethodOverride]
        return TensorDict(observation=torch.from_numpy(OBSERVATION), reward=1.0, terminated=False)


async def steps_per_second(env_cls: type[Env], n: int, duration: float) -> float:
    async with AsyncEnvPool([env_cls] * n, executor="inline") as pool:
        td = await pool.reset()
        td["action"] = torch.zeros(n, dtype=torch.int64)
        deadline = time.perf_counter() + 0.5
        while time.perf_counter() < deadline:  # warm-up
            await pool.step(td)
        steps, start = 0, time.perf_counter()
        while time.perf_counter() - start < duration:
            await pool.step(td)
            steps += n
        return steps / (time.perf_counter() - start)


async def run(n: int, duration: float, rounds: int) -> None:
    print(f"inline executor, N={n}, lockstep pool.step, {duration:g} s per row")
    print("| round | plain dict | dict, tensor observation (ratio) | TensorDict (ratio) |")
    print("|---:|---:|---:|---:|")
    for r in range(1, rounds + 1):
        plain = await steps_per_second(PlainDictEnv, n, duration)
        tensor = await steps_per_second(TensorObservationEnv, n, duration)
        tensordict = await steps_per_second(TensorDictEnv, n, duration)
        print(
            f"| {r} | {plain:,.0f} | {tensor:,.0f} ({plain / tensor:.2f}x) "
            f"| {tensordict:,.0f} ({plain / tensordict:.2f}x) |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--n", type=int, default=64, help="envs in the pool")
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per row")
    parser.add_argument("--rounds", type=int, default=3, help="pairs of rows, alternating")
    args = parser.parse_args()
    uvloop.run(run(args.n, args.duration, args.rounds))


if __name__ == "__main__":
    main()
