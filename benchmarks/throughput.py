"""Throughput: aenvs against its peers on the same work, in one run.

Random actions, auto-reset, env steps per second:
- CartPole-v1 (cheap steps), N = 2, 8, 32;
- a CPU-bound env (about 1 ms of numpy per step), N = 2, 8, 32;
- a large-observation env (uint8 4x84x84), N = 8, 32;
- start-up to the first reset, N = 8, with the workers' unique memory (USS).
aenvs runs two loops: lockstep (step_and_maybe_reset on the whole batch) and
overlapped (receive min_get=N//2, re-send those envs at once). Peers run lockstep.

    python benchmarks/throughput.py [--duration 2] [--only cartpole,cpu,pixels,startup] [--skip torchrl]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import gymnasium as gym
import numpy as np
import psutil
import torch
import uvloop

from aenvs import AsyncEnvPool
from aenvs.executors import ProcessExecutor


def _calibrate(seconds: float = 0.001) -> int:
    """Rounds of the CPU-bound env's work that take ``seconds`` here (fixed work, not a deadline)."""
    v, rounds, t0 = np.linspace(0, 1, 2048), 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.05:
        v = np.sin(v) + 0.1
        rounds += 1
    return max(1, round(rounds * seconds / (time.perf_counter() - t0)))


ROUNDS = _calibrate()


class CpuBoundEnv(gym.Env):
    """About 1 ms of numpy work per step (a fixed number of elementwise rounds)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (8,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.v = np.linspace(0, 1, 2048)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return np.zeros(8, np.float32), {}

    def step(self, action):
        v = self.v
        for _ in range(ROUNDS):
            v = np.sin(v) + 0.1
        self.t += 1
        return v[:8].astype(np.float32), 1.0, False, self.t >= 200, {}


class PixelsEnv(gym.Env):
    """uint8 4x84x84 frames, cheap steps."""

    observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    action_space = gym.spaces.Discrete(4)

    def __init__(self) -> None:
        self.frame = np.zeros((4, 84, 84), np.uint8)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return self.frame, {}

    def step(self, action):
        self.t += 1
        self.frame[:, self.t % 84] = action
        return self.frame, 0.0, False, self.t >= 500, {}


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


WORKLOADS: dict[str, tuple[Callable[[], gym.Env], tuple[int, ...], str]] = {
    "cartpole": (cartpole, (2, 8, 32), "CartPole-v1"),
    "cpu": (CpuBoundEnv, (2, 8, 32), ""),
    "pixels": (PixelsEnv, (8, 32), ""),
}


@dataclass
class Row:
    workload: str
    system: str
    n: int
    steps_per_s: float


def timed(step: Callable[[], int], duration: float) -> float:
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        step()
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < duration:
        steps += step()
    return steps / (time.perf_counter() - t0)


async def atimed(step: Callable[[], object], duration: float) -> float:
    end = time.perf_counter() + 0.3
    while time.perf_counter() < end:
        await step()  # type: ignore[misc]
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < duration:
        steps += await step()  # type: ignore[misc]
    return steps / (time.perf_counter() - t0)


def executor_for(name: str, n: int):
    return ProcessExecutor() if name == "process" else name


async def aenvs_rows(workload: str, make: Callable[[], gym.Env], n: int, duration: float) -> list[Row]:
    rows = []
    n_actions = make().action_space.n  # type: ignore[attr-defined]
    actions = [torch.randint(0, n_actions, (n,)) for _ in range(64)]
    for executor in ("process", "thread", "inline"):
        async with AsyncEnvPool([make] * n, executor=executor_for(executor, n)) as pool:
            td = await pool.reset()
            k = 0

            async def lockstep() -> int:
                nonlocal td, k
                td["action"] = actions[k % 64]
                k += 1
                _, td = await pool.step_and_maybe_reset(td)
                return n

            rows.append(Row(workload, f"aenvs {executor} lockstep", n, await atimed(lockstep, duration)))
            if executor == "inline":
                continue  # plain envs on the loop run one after the other: nothing to overlap
            td["action"] = actions[0]
            await pool.async_step_and_maybe_reset_send(td)

            async def overlapped() -> int:
                nonlocal k
                _, nxt = await pool.async_step_and_maybe_reset_recv(min_get=max(1, n // 2))
                nxt["action"] = actions[k % 64][: nxt.batch_size[0]]
                k += 1
                await pool.async_step_and_maybe_reset_send(nxt)
                return nxt.batch_size[0]

            rows.append(Row(workload, f"aenvs {executor} overlapped", n, await atimed(overlapped, duration)))
            await pool.async_step_and_maybe_reset_recv(min_get=n)
    return rows


def gymnasium_rows(workload: str, make: Callable[[], gym.Env], n: int, duration: float) -> list[Row]:
    rows = []
    for name, factory in (
        ("gymnasium SyncVectorEnv", lambda: gym.vector.SyncVectorEnv([make] * n)),
        ("gymnasium AsyncVectorEnv", lambda: gym.vector.AsyncVectorEnv([make] * n, shared_memory=True)),
    ):
        envs = factory()
        envs.reset(seed=0)
        actions = [envs.action_space.sample() for _ in range(64)]
        k = 0

        def step(envs=envs, actions=actions) -> int:
            nonlocal k
            envs.step(actions[k % 64])
            k += 1
            return n

        rows.append(Row(workload, name, n, timed(step, duration)))
        envs.close()
    return rows


def torchrl_rows(
    workload: str, env_id: str, make: Callable[[], gym.Env], n: int, duration: float
) -> list[Row]:
    try:
        from torchrl.envs import GymEnv, GymWrapper, ParallelEnv
    except Exception as exc:
        print(f"torchrl skipped: {exc!r}")
        return []

    def create():
        return GymEnv(env_id) if env_id else GymWrapper(make())

    env = ParallelEnv(n, create)
    td = env.reset()
    rows = []
    try:

        def step() -> int:
            nonlocal td
            td = env.rand_action(td)
            _, td = env.step_and_maybe_reset(td)
            return n

        rows.append(Row(workload, "torchrl ParallelEnv", n, timed(step, duration)))
    finally:
        env.close()
    return rows


def envpool_rows(n: int, duration: float) -> list[Row]:
    try:
        import envpool  # pyright: ignore[reportMissingImports]
    except Exception as exc:
        print(f"envpool skipped: {exc!r}")
        return []
    envs = envpool.make("CartPole-v1", env_type="gymnasium", num_envs=n)
    envs.reset()
    actions = np.zeros(n, np.int32)

    def step() -> int:
        envs.step(actions)
        return n

    return [Row("cartpole", "envpool", n, timed(step, duration))]


def startup_rows(skip: set[str]) -> list[dict]:
    out = []

    async def aenvs_start() -> tuple[float, float]:
        t0 = time.perf_counter()
        executor = ProcessExecutor(num_workers=8)
        async with AsyncEnvPool([cartpole] * 8, executor=executor) as pool:
            await pool.reset()
            took = time.perf_counter() - t0
            uss = np.mean([psutil.Process(p).memory_full_info().uss for p in executor.pids]) / 2**20
        return took, float(uss)

    for attempt in ("cold", "warm"):
        took, uss = uvloop.run(aenvs_start())
        out.append({"system": f"aenvs process ({attempt} zygote)", "seconds": took, "worker_uss_mb": uss})
    t0 = time.perf_counter()
    envs = gym.vector.AsyncVectorEnv([cartpole] * 8, shared_memory=True)
    envs.reset(seed=0)
    took = time.perf_counter() - t0
    uss = np.mean([c.memory_full_info().uss for c in psutil.Process().children()]) / 2**20
    envs.close()
    out.append({"system": "gymnasium AsyncVectorEnv", "seconds": took, "worker_uss_mb": float(uss)})
    if "torchrl" not in skip:
        try:
            from torchrl.envs import GymEnv, ParallelEnv

            t0 = time.perf_counter()
            env = ParallelEnv(8, lambda: GymEnv("CartPole-v1"))
            env.reset()
            took = time.perf_counter() - t0
            kids = psutil.Process().children(recursive=True)
            uss = np.mean([c.memory_full_info().uss for c in kids]) / 2**20 if kids else float("nan")
            env.close()
            out.append({"system": "torchrl ParallelEnv", "seconds": took, "worker_uss_mb": float(uss)})
        except Exception as exc:
            print(f"torchrl start-up skipped: {exc!r}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--only", default="cartpole,cpu,pixels,startup")
    parser.add_argument("--skip", default="", help="peers to leave out: torchrl,envpool,gymnasium")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "throughput"))
    args = parser.parse_args()
    only, skip = set(args.only.split(",")), set(filter(None, args.skip.split(",")))
    rows: list[Row] = []
    for workload, (make, sizes, env_id) in WORKLOADS.items():
        if workload not in only:
            continue
        for n in sizes:
            rows += uvloop.run(aenvs_rows(workload, make, n, args.duration))
            if "gymnasium" not in skip:
                rows += gymnasium_rows(workload, make, n, args.duration)
            if "torchrl" not in skip and n == 8:
                rows += torchrl_rows(workload, env_id, make, n, args.duration)
            if "envpool" not in skip and workload == "cartpole":
                rows += envpool_rows(n, args.duration)
            print(f"{workload} N={n} done", flush=True)
    lines = [
        "| workload | N | system | steps/s | aenvs process lockstep / system |",
        "|---|---:|---|---:|---:|",
    ]
    for r in rows:
        ref = next(
            x for x in rows if (x.workload, x.n, x.system) == (r.workload, r.n, "aenvs process lockstep")
        )
        lines.append(
            f"| {r.workload} | {r.n} | {r.system} | {r.steps_per_s:,.0f} | {ref.steps_per_s / r.steps_per_s:.2f}x |"
        )
    startup = startup_rows(skip) if "startup" in only else []
    if startup:
        lines += [
            "",
            "| start-up, 8 workers (CartPole) | seconds to first reset | worker USS (MB) |",
            "|---|---:|---:|",
        ]
        lines += [f"| {s['system']} | {s['seconds']:.2f} | {s['worker_uss_mb']:.1f} |" for s in startup]
    report = "\n".join(lines)
    print(report)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out + ".md", "w") as f:
        f.write(report + "\n")
    with open(args.out + ".json", "w") as f:
        json.dump({"rows": [asdict(r) for r in rows], "startup": startup}, f, indent=2)


if __name__ == "__main__":
    main()
