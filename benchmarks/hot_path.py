"""The pool's own cost on the inline lockstep loop, split into its parts, beside gymnasium.

An inline ``AsyncEnvPool`` of N CartPole-v1 envs in the lockstep step-and-reset loop
(``async_step_and_maybe_reset_send`` then ``_recv``, random actions drawn beforehand),
timed per batch and split into: the send, the env work (the plain envs' commands, run
when the receive takes the whole batch or flushes them: the envs' own steps plus the
runner's per-env work), the batch built from the buffers, and the rest of the receive.
Beside it, in the same process: the same loop as one call a batch
(``pool.step_and_maybe_reset``, the suite's "inline lockstep" row; on the inline executor
it runs its command where it sends it), gymnasium's ``SyncVectorEnv``, one env in a
plain Python loop (the env's own cost), and the same envs in a loop with no pool that
builds the same batches (``layout_loop_us``: what the pool's machinery is measured against),
and the pool's own runner and batch called directly with nothing around them
(``parts_alone_us``: the floor of any pool built from those pieces).

    python benchmarks/hot_path.py [--num-envs 8] [--batches 3000] [--profile tottime]

``--profile`` prints a cProfile of one more pass of each of the pool's two loops, sorted
as given.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import inspect
import pstats
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict

from aenvs import AsyncEnvPool
from aenvs._commands import Command, CommandKind


def best_of(repeats: int, run: Callable[[], float]) -> float:
    return min(run() for _ in range(repeats))


def plain_loop_us(steps: int) -> float:
    """Microseconds per step of one CartPole in a plain loop (auto-reset), numpy actions."""
    env = gym.make("CartPole-v1")
    env.reset(seed=0)
    actions = np.random.default_rng(0).integers(0, 2, steps)

    def run() -> float:
        t0 = time.perf_counter()
        for a in actions:
            _, _, terminated, truncated, _ = env.step(a)
            if terminated or truncated:
                env.reset()
        return (time.perf_counter() - t0) / steps * 1e6

    return best_of(3, run)


def sync_vector_us(n: int, batches: int) -> float:
    """Microseconds per batch of gymnasium's SyncVectorEnv (default autoreset)."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * n)
    envs.reset(seed=0)
    actions = [np.random.randint(0, 2, (n,)) for _ in range(batches)]

    def run() -> float:
        t0 = time.perf_counter()
        for a in actions:
            envs.step(a)
        return (time.perf_counter() - t0) / batches * 1e6

    try:
        return best_of(3, run)
    finally:
        envs.close()


def layout_loop_us(n: int, batches: int) -> float:
    """Microseconds per batch of the least a loop can do to hand over what the pool's
    ``step_and_maybe_reset`` does, with no pool: N CartPole envs stepped in a plain loop
    (auto-reset), their results written into numpy rows (the scalars a column at a time),
    and the batch built in TorchRL's layout (the input with its action, "next",
    "env_index"; the next input with the reset observations), by ``TensorDict._new_unsafe``
    from copies of the rows. No checks, no bookkeeping, no errors handled: what the pool's
    own machinery is measured against."""
    envs = [gym.make("CartPole-v1") for _ in range(n)]
    size, rows = torch.Size([n]), np.arange(n)
    obs, following = np.zeros((n, 4), np.float32), np.zeros((n, 4), np.float32)
    reward = np.zeros((n, 1), np.float32)
    terminated, truncated = np.zeros((n, 1), bool), np.zeros((n, 1), bool)
    for i, env in enumerate(envs):
        following[i] = env.reset(seed=i)[0]
    actions = [torch.randint(0, 2, (n,)) for _ in range(batches)]
    new: Callable[[dict[str, Any], torch.Size], TensorDict] = TensorDict._new_unsafe  # pyright: ignore[reportPrivateUsage, reportAssignmentType]

    def flags() -> torch.Tensor:
        return torch.from_numpy(np.zeros((n, 1), bool))

    def run() -> float:
        td = new({"observation": torch.from_numpy(following.copy())}, size)
        t0 = time.perf_counter()
        for a in actions:
            td["action"] = a
            sent = td["action"].numpy()
            rewards, terms, truncs = [], [], []  # a column each, written once a batch
            for i, env in enumerate(envs):
                o, r, term, trunc, _ = env.step(sent[i])
                obs[i] = o
                rewards.append(r)
                terms.append(term)
                truncs.append(trunc)
                following[i] = env.reset()[0] if term or trunc else o
            reward[:, 0], terminated[:, 0], truncated[:, 0] = rewards, terms, truncs
            nxt = {"observation": obs.copy(), "reward": reward.copy(), "terminated": terminated.copy()}
            nxt |= {"truncated": truncated.copy(), "done": terminated | truncated}
            step = new({k: torch.from_numpy(v) for k, v in nxt.items()}, size)
            index = torch.from_numpy(rows.copy())
            _ = new({**td._tensordict, "next": step, "env_index": index}, size)  # pyright: ignore[reportPrivateUsage]
            reset = {"observation": torch.from_numpy(following.copy()), "done": flags()}
            reset |= {"terminated": flags(), "truncated": flags(), "env_index": torch.from_numpy(rows.copy())}
            td = new(reset, size)
        return (time.perf_counter() - t0) / batches * 1e6

    try:
        return best_of(3, run)
    finally:
        for env in envs:
            env.close()


async def pool_parts(n: int, batches: int, copy_results: bool, profile: str | None) -> dict[str, float]:
    """Microseconds per batch of the pool's loop, whole and by part (best of 3 passes)."""
    options: dict[str, Any] = {} if copy_results else {"copy_results": False}  # also for older aenvs
    async with AsyncEnvPool(["CartPole-v1"] * n, executor="inline", **options) as pool:
        td = await pool.reset(seed=0)
        actions = [torch.randint(0, 2, (n,)) for _ in range(batches)]
        parts = {"send": 0.0, "env work": 0.0, "batch": 0.0, "receive": 0.0}
        executor: Any = pool.executor
        batcher: Any = pool._batcher  # pyright: ignore[reportPrivateUsage]
        flush, build = executor.flush, batcher.step_and_reset_batch
        # a lockstep receive runs the batch through run_whole (aenvs after 2026-11-25), else flush
        run_whole = getattr(executor, "run_whole", None)

        def timed_flush() -> None:
            t = time.perf_counter()
            flush()
            parts["env work"] += time.perf_counter() - t

        def timed_run_whole(*args: Any) -> Any:
            t = time.perf_counter()
            out = run_whole(*args)  # pyright: ignore[reportOptionalCall]
            parts["env work"] += time.perf_counter() - t
            return out

        if run_whole is not None:
            executor.run_whole = timed_run_whole

        def timed_build(*args: Any) -> Any:
            t = time.perf_counter()
            out = build(*args)
            parts["batch"] += time.perf_counter() - t
            return out

        executor.flush, batcher.step_and_reset_batch = timed_flush, timed_build

        async def one_pass() -> dict[str, float]:
            nonlocal td
            for key in parts:
                parts[key] = 0.0
            t_start = time.perf_counter()
            for a in actions:
                td["action"] = a
                t0 = time.perf_counter()
                await pool.async_step_and_maybe_reset_send(td)
                t1 = time.perf_counter()
                _, td = await pool.async_step_and_maybe_reset_recv()
                parts["send"] += t1 - t0
                parts["receive"] += time.perf_counter() - t1
            whole = time.perf_counter() - t_start
            parts["receive"] -= parts["env work"] + parts["batch"]
            return {"batch total": whole, **parts}

        await one_pass()  # warm-up
        passes = [await one_pass() for _ in range(3)]
        best = min(passes, key=lambda p: p["batch total"])
        if profile:
            executor.flush, batcher.step_and_reset_batch = flush, build
            if run_whole is not None:
                executor.run_whole = run_whole
            profiler = cProfile.Profile()
            profiler.enable()
            await one_pass()
            profiler.disable()
            pstats.Stats(profiler).sort_stats(profile).print_stats(30)
        return {key: value / batches * 1e6 for key, value in best.items()}


async def whole_call_us(n: int, batches: int, profile: str | None) -> float:
    """Microseconds per batch of ``pool.step_and_maybe_reset`` in a loop (best of 3 passes)."""
    async with AsyncEnvPool(["CartPole-v1"] * n, executor="inline") as pool:
        td = await pool.reset(seed=0)
        actions = [torch.randint(0, 2, (n,)) for _ in range(batches)]

        async def one_pass() -> float:
            nonlocal td
            t0 = time.perf_counter()
            for a in actions:
                td["action"] = a
                _, td = await pool.step_and_maybe_reset(td)
            return (time.perf_counter() - t0) / batches * 1e6

        await one_pass()  # warm-up
        best = min([await one_pass() for _ in range(3)])
        if profile:
            profiler = cProfile.Profile()
            profiler.enable()
            await one_pass()
            profiler.disable()
            pstats.Stats(profiler).sort_stats(profile).print_stats(30)
        return best


async def parts_alone_us(n: int, batches: int) -> dict[str, float] | None:
    """Microseconds per batch of the pool's own pieces of a lockstep step-and-reset called
    directly, with nothing around them (no send or receive, no slot table, no calls between
    them): the runner's pass over the N envs, then with the batch built from the rows, then
    with the actions checked and written too. What the pool costs with all of its machinery
    but those pieces taken away: the floor of any pool built from them.

    None where the pool has no such pieces to call (aenvs before 2026-11-25).
    """
    async with AsyncEnvPool(["CartPole-v1"] * n, executor="inline") as pool:
        td = await pool.reset(seed=0)
        runner: Any = getattr(pool.executor, "_runner", None)
        batcher: Any = pool._batcher  # pyright: ignore[reportPrivateUsage]
        if runner is None or not hasattr(runner, "run_plain") or not hasattr(batcher, "step_and_reset_whole"):
            return None
        indices = list(range(n))
        command = Command(CommandKind.STEP_AND_RESET, indices)
        actions = [torch.randint(0, 2, (n,)) for _ in range(batches)]

        def one_pass(batch: bool, write: bool) -> float:
            t0 = time.perf_counter()
            for a in actions:
                td["action"] = a
                if write:
                    batcher.write_actions(td, indices, batcher.check_actions(td, indices))
                runner.run_plain(command, True, packed=True)
                if batch:
                    batcher.step_and_reset_whole(td)
            return (time.perf_counter() - t0) / batches * 1e6

        # the actions written once: the passes without the write step the envs with them
        td["action"] = actions[0]
        batcher.write_actions(td, indices, batcher.check_actions(td, indices))
        one_pass(True, True)  # warm-up
        return {
            "the runner": best_of(3, lambda: one_pass(False, False)),
            "+ the batch": best_of(3, lambda: one_pass(True, False)),
            "+ the actions checked and written": best_of(3, lambda: one_pass(True, True)),
        }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--batches", type=int, default=3000)
    parser.add_argument("--profile", default=None, help="cProfile sort key (tottime, cumulative)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n, batches = args.num_envs, args.batches
    env_us = plain_loop_us(batches)
    sync_us = sync_vector_us(n, batches)
    print(f"CartPole-v1, N = {n}, {batches} batches, best of 3; microseconds per batch")
    print(f"  one env in a plain loop: {env_us:.2f} us per step ({n} steps: {n * env_us:.1f})")
    print(f"  gymnasium SyncVectorEnv: {sync_us:.1f}")
    layout_us = layout_loop_us(n, batches)
    print(
        f"  no pool, the same loop in the pool's layout: {layout_us:.1f} ({sync_us / layout_us:.2f}x SyncVectorEnv)"
    )
    alone = asyncio.run(parts_alone_us(n, batches))
    if alone is not None:
        print(
            "  the pool's runner and batch alone, no pool around them: "
            + ", ".join(f"{key} {us:.1f} ({sync_us / us:.2f}x)" for key, us in alone.items())
        )
    whole = asyncio.run(whole_call_us(n, batches, args.profile))
    own = whole - n * env_us
    print(
        f"  aenvs inline, step_and_maybe_reset: {whole:.1f} ({sync_us / whole:.2f}x SyncVectorEnv; "
        f"the pool's own {own:.1f} per batch, {own / n:.2f} per env step; "
        f"{whole - layout_us:.1f} over the no-pool loop)"
    )
    modes = (True, False) if "copy_results" in inspect.signature(AsyncEnvPool).parameters else (True,)
    for copy_results in modes:
        parts = asyncio.run(pool_parts(n, batches, copy_results, args.profile if copy_results else None))
        total = parts["batch total"]
        own = total - n * env_us
        print(
            f"  aenvs inline, copy_results={copy_results}: {total:.1f} ({sync_us / total:.2f}x SyncVectorEnv; "
            f"the pool's own {own:.1f} per batch, {own / n:.2f} per env step)"
        )
        print(
            "    " + ", ".join(f"{key} {value:.1f}" for key, value in parts.items() if key != "batch total")
        )


if __name__ == "__main__":
    main()
