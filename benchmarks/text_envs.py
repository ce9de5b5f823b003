"""Text envs: observations of 200-2,000 characters, text actions, on every executor.

An echo-style env (the observation is a string of 200-2,000 characters, the action a
short string; the step itself does almost nothing) at several N, in one run:

- aenvs on each executor, lockstep (send all, receive all) and overlapped (receive
  whichever envs are ready, send them straight back);
- gymnasium's ``AsyncVectorEnv(shared_memory=False)`` (one process per env: run up to
  N = 64 here) and a plain ``ThreadPoolExecutor`` loop over the same envs (lockstep);
- a mixed pool (a fixed-shape observation plus a text field) against a fixed-shape-only
  one, inline: what carrying the text costs.

Reported: env steps/s and this process's CPU per env step (``time.process_time``: the
pool's own cost where the envs run elsewhere), best of ``--repeats``.

Run:
    python benchmarks/text_envs.py --num-envs 8 64 512 --steps 2000
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces
from tensordict import TensorDict

import aenvs
from aenvs._tensors import non_tensor_stack

CHARSET = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,"
ACTIONS = ("look", "go north", "take lamp", "open door")


@dataclass
class Row:
    workload: str
    system: str
    n: int
    steps_per_s: float
    cpu_us_per_step: float


class EchoText(gym.Env[Any, str]):
    """Observation: a page of 200-2,000 characters that echoes the action; never ends."""

    def __init__(self, mixed: bool = False, text: bool = True) -> None:
        self.text, self.mixed = text, mixed
        page = spaces.Text(2000, min_length=0, charset=CHARSET)
        pos = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.observation_space: spaces.Space[Any] = (
            spaces.Dict({"page": page, "pos": pos}) if mixed else page if text else pos
        )
        self.action_space = spaces.Text(16, charset=CHARSET)
        self._pages = ["".join(CHARSET[(i * 7 + k) % len(CHARSET)] for k in range(2000)) for i in range(8)]
        self._t = 0

    def _obs(self, action: str) -> Any:
        self._t += 1
        length = 200 + (self._t * 397) % 1801
        page = (action + " " + self._pages[self._t % 8])[:length]
        pos = np.full(4, (self._t % 100) / 100, np.float32)
        if self.mixed:
            return {"page": page, "pos": pos}
        return page if self.text else pos

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        return self._obs("start"), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self._obs(str(action)), 1.0, False, False, {}


def _actions(k: int) -> TensorDict:
    td = TensorDict({}, [k])
    td.set("action", non_tensor_stack([ACTIONS[i % 4] for i in range(k)]))
    return td


def _timed(run: Callable[[], int], repeats: int) -> tuple[float, float]:
    """Best steps/s and this process's CPU us per step over ``repeats`` runs of ``run``."""
    best_rate, best_cpu = 0.0, float("inf")
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        steps = run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        best_rate, best_cpu = max(best_rate, steps / wall), min(best_cpu, cpu / steps * 1e6)
    return best_rate, best_cpu


def measure_aenvs(
    executor: str, n: int, steps: int, repeats: int, overlapped: bool, **env: Any
) -> tuple[float, float]:
    async def main() -> tuple[float, float]:
        factory = lambda: EchoText(**env)  # noqa: E731 - pickled by value with the script
        async with aenvs.AsyncEnvPool([factory] * n, executor=executor) as pool:
            await pool.reset()
            rounds = max(1, steps // n)
            loop = asyncio.get_running_loop()

            async def lockstep() -> int:
                for _ in range(rounds):
                    await pool.step(_actions(n))
                return rounds * n

            async def overlap() -> int:
                await pool.async_step_send(_actions(n))
                done = 0
                while done < rounds * n:
                    out = await pool.async_step_recv(min_get=1)
                    done += out.batch_size[0]
                    await pool.async_step_send(_actions(out.batch_size[0]), env_index=out["env_index"])
                await pool.async_step_recv(min_get=n)  # the last round in flight
                return done

            best_rate, best_cpu = 0.0, float("inf")
            for _ in range(repeats):
                wall, cpu = loop.time(), time.process_time()
                done = await (overlap() if overlapped else lockstep())
                wall, cpu = loop.time() - wall, time.process_time() - cpu
                best_rate, best_cpu = max(best_rate, done / wall), min(best_cpu, cpu / done * 1e6)
            return best_rate, best_cpu

    return asyncio.run(main())


def measure_gymnasium_async(n: int, steps: int, repeats: int) -> tuple[float, float]:
    envs = gym.vector.AsyncVectorEnv([EchoText] * n, shared_memory=False)
    try:
        envs.reset(seed=0)
        actions = tuple(ACTIONS[i % 4] for i in range(n))
        rounds = max(1, steps // n)

        def run() -> int:
            for _ in range(rounds):
                envs.step(actions)
            return rounds * n

        return _timed(run, repeats)
    finally:
        envs.close()


def measure_thread_pool(n: int, steps: int, repeats: int) -> tuple[float, float]:
    envs = [EchoText() for _ in range(n)]
    for env in envs:
        env.reset(seed=0)
    rounds = max(1, steps // n)
    with concurrent.futures.ThreadPoolExecutor(min(n, 64)) as pool:

        def run() -> int:
            for _ in range(rounds):
                list(pool.map(lambda i: envs[i].step(ACTIONS[i % 4]), range(n)))
            return rounds * n

        return _timed(run, repeats)


def measure(
    num_envs: Sequence[int] = (8, 64, 512),
    steps: int = 2000,
    repeats: int = 3,
    executors: Sequence[str] = ("inline", "thread", "process"),
    gymnasium_max_n: int = 64,
) -> list[Row]:
    rows: list[Row] = []

    def add(workload: str, system: str, n: int, result: tuple[float, float]) -> None:
        rows.append(Row(workload, system, n, *result))
        print(
            f"{workload:6s} {system:34s} N={n:4d} {result[0]:10,.0f} steps/s {result[1]:8.1f} us CPU/step",
            flush=True,
        )

    torch.set_num_threads(1)
    for n in num_envs:
        for executor in executors:
            for overlapped in (False, True):
                mode = "overlapped" if overlapped else "lockstep"
                add(
                    "text",
                    f"aenvs {executor} {mode}",
                    n,
                    measure_aenvs(executor, n, steps, repeats, overlapped),
                )
        add("text", "ThreadPoolExecutor loop", n, measure_thread_pool(n, steps, repeats))
        if n <= gymnasium_max_n:
            add("text", "gymnasium AsyncVectorEnv (no shm)", n, measure_gymnasium_async(n, steps, repeats))
    n = 64
    for workload, env in (("fixed", {"text": False}), ("mixed", {"mixed": True}), ("text", {"text": True})):
        add(
            f"{workload}",
            "aenvs inline lockstep (carry cost)",
            n,
            measure_aenvs("inline", n, steps, repeats, False, **env),
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--executors", nargs="+", default=["inline", "thread", "process"])
    args = parser.parse_args()
    measure(args.num_envs, args.steps, args.repeats, args.executors)


if __name__ == "__main__":
    main()
