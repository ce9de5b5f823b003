"""Overlap policy inference with env steps: lockstep against as-ready batching.

When envs are slow and their latency varies (a simulator behind an RPC, a web
page, an LLM tool call), waiting for *every* env before running the policy
leaves the policy idle while the slowest env finishes, and leaves every env
idle while the policy runs. With aenvs you can instead receive whichever envs
are ready (``min_get=k`` for a small k), run the policy on those only and send
them straight back, while the others are still stepping.

Two high-latency envs show it, each on the executor that suits it:

* ``RemoteEnv``: ``async def step`` awaiting ``asyncio.sleep`` (5-30 ms), on
  ``executor="inline"``: every env is a coroutine on the event loop.
* ``BlockingEnv``: a plain ``step`` calling ``time.sleep`` (5-30 ms), on
  ``executor="thread"``: one worker thread per env.

The policy is a small MLP whose forward pass is padded with real matmuls to a
fixed cost per call (``--infer-ms``, default 3 ms), whatever the batch size, as a
big model on an accelerator behaves. Since every call costs the same, the
overlapped loop waits for a few envs (``--min-get``, default 4) rather than one:
``--min-get 1`` answers each env soonest but spends more time in the policy.
Both loops run the same number of env steps.

Run:
    python examples/overlap_inference.py --steps 3000 --num-envs 32 --min-get 4
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase
from torch import nn

import aenvs
from aenvs import AsyncEnvPool, EnvContext

OBS_DIM, NUM_ACTIONS, EPISODE_LENGTH = 8, 4, 50


@dataclass
class Args:
    steps: int = field(default=3000, metadata={"help": "env steps per loop (summed over envs)"})
    num_envs: int = field(default=32, metadata={"help": "envs in each pool"})
    min_get: int = field(
        default=4, metadata={"help": "overlapped loop: run the policy once this many envs are ready"}
    )
    latency_ms: tuple[float, float] = field(
        default=(5.0, 30.0), metadata={"help": "env step latency range (ms), drawn uniformly per step"}
    )
    infer_ms: float = field(default=3.0, metadata={"help": "cost of one policy forward pass (ms)"})
    seed: int = field(default=0, metadata={"help": "seeds the envs and the policy"})


def parse_args(argv: list[str] | None = None) -> Args:
    """One ``--flag`` per field of :class:`Args`."""
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, max_help_position=32),
    )
    for f in dataclasses.fields(Args):
        default = f.default
        flag = "--" + f.name.replace("_", "-")
        help_text = f"{f.metadata['help']} (default: {default})"
        if isinstance(default, tuple):
            parser.add_argument(
                flag, type=float, nargs=2, default=default, metavar=("LOW", "HIGH"), help=help_text
            )
        else:
            parser.add_argument(flag, type=type(default), default=default, help=help_text)
    values: dict[str, Any] = vars(parser.parse_args(argv))
    values["latency_ms"] = tuple(values["latency_ms"])
    return Args(**values)


# -- the envs --------------------------------------------------------------------------


class _RandomWalk(aenvs.Env):
    """A toy task with a slow step: drift an 8-d point; reward for staying near 0."""

    observation_space = spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32)
    action_space = spaces.Discrete(NUM_ACTIONS)

    def __init__(self, latency: tuple[float, float], seed: int) -> None:
        self.latency = latency
        self.rng = np.random.default_rng(seed)
        self.pos = np.zeros(OBS_DIM, np.float32)
        self.t = 0

    def delay(self) -> float:
        return float(self.rng.uniform(*self.latency))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> TensorDictBase:
        self.pos = self.rng.normal(0.0, 0.1, OBS_DIM).astype(np.float32)
        self.t = 0
        return TensorDict(observation=torch.from_numpy(self.pos.copy()))

    def advance(self, action: int) -> TensorDictBase:
        self.pos += self.rng.normal(0.0, 0.1, OBS_DIM).astype(np.float32)
        self.pos[action % OBS_DIM] *= 0.5
        self.t += 1
        return TensorDict(
            observation=torch.from_numpy(self.pos.copy()),
            reward=torch.tensor([-float(np.linalg.norm(self.pos))]),
            terminated=torch.tensor([self.t >= EPISODE_LENGTH]),
        )


class RemoteEnv(_RandomWalk):
    """Its step awaits ``asyncio.sleep``: run it with ``executor="inline"``."""

    async def step(self, td: TensorDictBase) -> TensorDictBase:  # type: ignore[override]
        await asyncio.sleep(self.delay())
        return self.advance(int(td["action"]))


class BlockingEnv(_RandomWalk):
    """Its step blocks in ``time.sleep``: run it with ``executor="thread"``."""

    def step(self, td: TensorDictBase) -> TensorDictBase:
        time.sleep(self.delay())
        return self.advance(int(td["action"]))


# -- the policy ------------------------------------------------------------------------


class SlowPolicy(nn.Module):
    """A small MLP whose forward pass costs ``infer_ms`` per call, whatever the batch.

    The padding is real work (matmuls, during which torch releases the GIL, as real
    inference does), repeated until the call has taken ``infer_ms``.
    """

    def __init__(self, infer_ms: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(OBS_DIM, 64), nn.Tanh(), nn.Linear(64, NUM_ACTIONS))
        self.seconds = infer_ms / 1e3
        self.register_buffer("scratch", torch.randn(128, 128))
        self.calls = 0

    @torch.inference_mode()
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        started = time.perf_counter()
        logits = self.net(obs)
        scratch: torch.Tensor = self.scratch  # type: ignore[assignment]
        while time.perf_counter() - started < self.seconds:
            scratch = torch.tanh(scratch @ scratch)
        self.calls += 1
        return torch.distributions.Categorical(logits=logits).sample()


# -- the two loops ---------------------------------------------------------------------


async def lockstep(pool: AsyncEnvPool, policy: SlowPolicy, steps: int) -> int:
    """Send every env, wait for every env (``min_get=N``), run the policy on all; repeat."""
    td = await pool.reset()
    done = 0
    while done < steps:
        td = td[: min(len(td), steps - done)]
        td["action"] = policy(td["observation"])
        await pool.async_step_and_maybe_reset_send(td)
        _, td = await pool.async_step_and_maybe_reset_recv(min_get=len(td))  # the slowest env sets the pace
        done += len(td)
    return done


async def overlapped(pool: AsyncEnvPool, policy: SlowPolicy, steps: int, min_get: int = 1) -> int:
    """Receive whichever envs are ready, run the policy on those only, send them back at once."""
    td = await pool.reset()
    td["action"] = policy(td["observation"])
    await pool.async_step_and_maybe_reset_send(td)
    sent, done = len(td), 0
    while done < steps:
        # the envs not received keep stepping while the policy runs on these
        _, td = await pool.async_step_and_maybe_reset_recv(min_get=min(min_get, sent - done))
        done += len(td)
        td = td[: min(len(td), steps - sent)]  # stop sending once every step is sent
        if len(td):
            td["action"] = policy(td["observation"])
            await pool.async_step_and_maybe_reset_send(td)
            sent += len(td)
    return done


async def measure(name: str, env_cls: type[_RandomWalk], executor: str, args: Args) -> float:
    """Run both loops, each on a fresh pool of ``env_cls``; print and return the speed-up."""
    latency = (args.latency_ms[0] / 1e3, args.latency_ms[1] / 1e3)

    def env_fn(ctx: EnvContext) -> _RandomWalk:
        return env_cls(latency, seed=args.seed * 10_000 + ctx.env_index)

    print(f"{name}: {args.num_envs} envs, executor={executor!r}, {args.steps} steps per loop", flush=True)
    throughput: dict[str, float] = {}
    for label in ("lockstep", "overlapped"):
        policy = SlowPolicy(args.infer_ms)
        async with AsyncEnvPool([env_fn] * args.num_envs, executor=executor) as pool:
            started = time.perf_counter()
            if label == "lockstep":
                steps = await lockstep(pool, policy, args.steps)
            else:
                steps = await overlapped(pool, policy, args.steps, args.min_get)
            seconds = time.perf_counter() - started
        throughput[label] = steps / seconds
        print(
            f"  {label + ':':<12}{steps / seconds:8.1f} steps/s  ({steps} steps in {seconds:.2f} s, "
            f"{policy.calls} policy calls, {steps / policy.calls:.1f} envs per call)",
            flush=True,
        )
    speedup = throughput["overlapped"] / throughput["lockstep"]
    print(f"  {'speed-up:':<12}{speedup:8.2f}x", flush=True)
    return speedup


async def main(args: Args) -> None:
    """Measure both loops on both envs."""
    torch.manual_seed(args.seed)
    await measure("RemoteEnv (async def step, asyncio.sleep)", RemoteEnv, "inline", args)
    await measure("BlockingEnv (plain step, time.sleep)", BlockingEnv, "thread", args)


if __name__ == "__main__":
    torch.set_num_threads(1)  # the policy's matmuls are small; leave the other core to the envs
    try:
        import uvloop
    except ImportError:
        asyncio.run(main(parse_args()))
    else:
        uvloop.run(main(parse_args()))
