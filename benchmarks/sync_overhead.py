"""The sync shim against TorchRL's and gymnasium's batched envs, on CartPole-v1.

For each batched env and each N, in one run:

- steps/s: env steps per second of a ``step_and_maybe_reset`` loop (TorchRL's data
  collection loop; for gymnasium, ``VectorEnv.step`` with its own auto-reset), with
  random actions drawn beforehand, after a warm-up, best of ``--repeats``;
- rollout: seconds for ``env.rollout(--steps, break_when_any_done=False)`` (aenvs and
  TorchRL; gymnasium has none);
- CPU us per batched step of this process in the best loop (``time.process_time``): for
  SerialEnv and SyncVectorEnv, which run everything in this process, the ratio of these is
  the speed ratio without the noise of other jobs on a shared machine.

Compared: ``aenvs.SerialEnv`` (executor "inline") and ``aenvs.ParallelEnv`` (executor
"process"), ``torchrl.envs.SerialEnv`` / ``ParallelEnv`` of ``GymEnv("CartPole-v1")``,
the drop-in ``aenvs.torchrl.SerialEnv`` / ``ParallelEnv`` (TorchRL's classes on the aenvs
core: ``from aenvs.torchrl import SerialEnv, ParallelEnv``) of the same ``GymEnv`` members and,
rows ``[gym]``, of ``gymnasium.make`` members, ``gymnasium.vector.SyncVectorEnv`` /
``AsyncVectorEnv``.
Targets: aenvs SerialEnv >= 5x TorchRL SerialEnv and >= 1/3 of SyncVectorEnv; aenvs
ParallelEnv >= 5x TorchRL ParallelEnv; the drop-in SerialEnv / ParallelEnv >= 5x TorchRL's.

Run:
    python benchmarks/sync_overhead.py --steps 1000 --num-envs 4 8
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch

import aenvs
from aenvs._sync import BatchedEnv

ENV_ID = "CartPole-v1"


@dataclass
class Result:
    name: str
    num_envs: int
    steps_per_second: float
    rollout_seconds: float | None
    startup_seconds: float
    cpu_us: float  # this process's CPU per batched step (best loop): all the work for in-process envs


def make_gym_env() -> gym.Env:
    return gym.make(ENV_ID)


def make_torchrl_env() -> Any:
    from torchrl.envs import GymEnv

    return GymEnv(ENV_ID)


def best_of(repeats: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(repeats))


_cpu_seconds: list[float] = []  # CPU seconds of each timed loop of the current case


@contextlib.contextmanager
def timed_cpu() -> Iterator[None]:
    """Record this process's CPU seconds over the block (time.process_time: every thread)."""
    c0 = time.process_time()
    yield
    _cpu_seconds.append(time.process_time() - c0)


def best_cpu_us(steps: int) -> float:
    """The best loop's CPU microseconds per batched step, and a fresh record for the next case."""
    best = min(_cpu_seconds) if _cpu_seconds else float("nan")
    _cpu_seconds.clear()
    return 1e6 * best / steps


# -- one runner per library --------------------------------------------------------------------


def time_step_loop(env: Any, actions: torch.Tensor, steps: int, repeats: int) -> tuple[float, float, float]:
    """Seconds of the best ``step_and_maybe_reset`` loop, its CPU us per step, best rollout seconds."""

    def loop() -> float:
        td = env.reset()
        for t in range(50):
            td["action"] = actions[t]
            _, td = env.step_and_maybe_reset(td)
        t0 = time.perf_counter()
        with timed_cpu():
            for t in range(steps):
                td["action"] = actions[t]
                _, td = env.step_and_maybe_reset(td)
        return time.perf_counter() - t0

    def rollout() -> float:
        t0 = time.perf_counter()
        env.rollout(steps, break_when_any_done=False)
        return time.perf_counter() - t0

    seconds = best_of(repeats, loop)
    cpu = best_cpu_us(steps)
    return seconds, cpu, best_of(repeats, rollout)


@contextlib.contextmanager
def aenvs_env(cls: type[BatchedEnv], n: int) -> Iterator[BatchedEnv]:
    env = cls(n, make_gym_env)
    try:
        yield env
    finally:
        env.close()


def run_aenvs(cls: type[BatchedEnv], n: int, steps: int, repeats: int) -> Result:
    began = time.perf_counter()
    with aenvs_env(cls, n) as env:
        startup = time.perf_counter() - began
        env.set_seed(0)
        actions = torch.randint(0, 2, (steps, n))
        seconds, cpu, rollout_seconds = time_step_loop(env, actions, steps, repeats)
    return Result(f"aenvs.{cls.__name__}", n, steps * n / seconds, rollout_seconds, startup, cpu)


def run_torchrl(parallel: bool, n: int, steps: int, repeats: int) -> Result | None:
    try:
        from torchrl.envs import ParallelEnv, SerialEnv
    except ImportError:
        return None
    cls = ParallelEnv if parallel else SerialEnv
    return run_envbase(f"torchrl.{cls.__name__}", cls, make_torchrl_env, n, steps, repeats)


def run_dropin(parallel: bool, gym_members: bool, n: int, steps: int, repeats: int) -> Result | None:
    """The drop-in (``from aenvs.torchrl import SerialEnv, ParallelEnv``), TorchRL's loop and work:
    members ``GymEnv("CartPole-v1")`` as TorchRL's rows, or ``gymnasium.make`` (rows ``[gym]``)."""
    try:
        from aenvs.torchrl import ParallelEnv, SerialEnv
    except ImportError:
        return None
    cls = ParallelEnv if parallel else SerialEnv
    name = f"aenvs.torchrl.{cls.__name__}" + ("[gym]" if gym_members else "")
    try:
        return run_envbase(name, cls, make_gym_env if gym_members else make_torchrl_env, n, steps, repeats)
    except Exception as error:  # a drop-in that cannot run this case: say so, keep the other rows
        print(f"  {name:34s} N={n:<3d} could not run: {type(error).__name__}: {error}", flush=True)
        return None


def run_envbase(name: str, cls: Any, make_env: Callable[[], Any], n: int, steps: int, repeats: int) -> Result:
    """A TorchRL batched env class (TorchRL's or the drop-in) of ``n`` members ``make_env()``."""
    began = time.perf_counter()
    env = cls(n, make_env)
    try:
        env.set_seed(0)
        env.reset()
        startup = time.perf_counter() - began
        actions = torch.randint(0, 2, (steps, n))
        if env.full_action_spec["action"].shape[-1:] == (2,):  # TorchRL's CartPole: one-hot
            actions = torch.nn.functional.one_hot(actions, 2)
        seconds, cpu, rollout_seconds = time_step_loop(env, actions, steps, repeats)
    finally:
        env.close()
    return Result(name, n, steps * n / seconds, rollout_seconds, startup, cpu)


def run_gymnasium(asynchronous: bool, n: int, steps: int, repeats: int) -> Result:
    cls = gym.vector.AsyncVectorEnv if asynchronous else gym.vector.SyncVectorEnv
    began = time.perf_counter()
    env = cls([make_gym_env] * n)
    try:
        env.reset(seed=0)
        startup = time.perf_counter() - began
        actions = np.random.default_rng(0).integers(0, 2, (steps, n))

        def loop() -> float:
            env.reset()
            for t in range(50):
                env.step(actions[t])
            t0 = time.perf_counter()
            with timed_cpu():
                for t in range(steps):
                    env.step(actions[t])
            return time.perf_counter() - t0

        seconds = best_of(repeats, loop)
        cpu = best_cpu_us(steps)
    finally:
        env.close()
    return Result(f"gymnasium.{cls.__name__}", n, steps * n / seconds, None, startup, cpu)


# -- the table --------------------------------------------------------------------------------------


def ratio(results: dict[tuple[str, int], Result], a: str, b: str, n: int) -> str:
    x, y = results.get((a, n)), results.get((b, n))
    if x is None or y is None:
        return "n/a"
    return f"{x.steps_per_second / y.steps_per_second:.2f}x"


def measure(
    num_envs: Sequence[int] = (4, 8), steps: int = 1000, repeats: int = 3, skip_torchrl: bool = False
) -> list[Result]:
    """One result per batched env and N, printed as measured (``aenvs bench`` calls this)."""
    warnings.simplefilter("ignore")  # TorchRL and gymnasium deprecation chatter
    torch.manual_seed(0)
    torch.set_num_threads(1)
    results: list[Result] = []
    for n in num_envs:
        runs: list[Callable[[], Result | None]] = [
            functools.partial(run_aenvs, aenvs.SerialEnv, n, steps, repeats),
            functools.partial(run_aenvs, aenvs.ParallelEnv, n, steps, repeats),
            functools.partial(run_gymnasium, False, n, steps, repeats),
            functools.partial(run_gymnasium, True, n, steps, repeats),
        ]
        if not skip_torchrl:
            runs += [
                functools.partial(run_torchrl, False, n, steps, repeats),
                functools.partial(run_torchrl, True, n, steps, repeats),
                functools.partial(run_dropin, False, False, n, steps, repeats),
                functools.partial(run_dropin, True, False, n, steps, repeats),
                functools.partial(run_dropin, False, True, n, steps, repeats),
                functools.partial(run_dropin, True, True, n, steps, repeats),
            ]
        for run in runs:
            result = run()
            gc.collect()
            if result is not None:
                results.append(result)
                rollout = f"{result.rollout_seconds:6.3f}" if result.rollout_seconds is not None else "   n/a"
                print(
                    f"  {result.name:34s} N={n:<3d} {result.steps_per_second:>10,.0f} steps/s  "
                    f"rollout({steps}) {rollout} s  start {result.startup_seconds:5.2f} s  "
                    f"CPU {result.cpu_us:6.1f} us/batched step (this process)",
                    flush=True,
                )
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=1000, help="batched steps per loop (default: 1000)")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[4, 8], help="N values (default: 4 8)")
    parser.add_argument("--repeats", type=int, default=3, help="timed loops per case, best kept (default: 3)")
    parser.add_argument("--skip-torchrl", action="store_true", help="leave TorchRL out (slow to start)")
    args = parser.parse_args(argv)
    results = {
        (r.name, r.num_envs): r for r in measure(args.num_envs, args.steps, args.repeats, args.skip_torchrl)
    }

    print()
    print(
        f"CartPole-v1, step_and_maybe_reset loop of {args.steps} batched steps (env steps/s, best of {args.repeats})"
    )
    names = sorted({name for name, _ in results}, key=lambda s: (not s.startswith("aenvs"), s))
    header = (
        f"| {'batched env':34s} | "
        + " | ".join(f"N={n:<4d} steps/s | rollout s" for n in args.num_envs)
        + " |"
    )
    print(header)
    print("|" + "---|" * (1 + 2 * len(args.num_envs)))
    for name in names:
        cells = []
        for n in args.num_envs:
            r = results.get((name, n))
            if r is None:
                cells += ["n/a", "n/a"]
            else:
                cells += [
                    f"{r.steps_per_second:,.0f}",
                    f"{r.rollout_seconds:.3f}" if r.rollout_seconds is not None else "-",
                ]
        print(f"| {name:34s} | " + " | ".join(cells) + " |")
    print()
    checks = [
        ("aenvs.SerialEnv / torchrl.SerialEnv", "aenvs.SerialEnv", "torchrl.SerialEnv", 5.0),
        ("aenvs.SerialEnv / gymnasium.SyncVectorEnv", "aenvs.SerialEnv", "gymnasium.SyncVectorEnv", 1 / 3),
        ("aenvs.ParallelEnv / torchrl.ParallelEnv", "aenvs.ParallelEnv", "torchrl.ParallelEnv", 5.0),
        (
            "aenvs.ParallelEnv / gymnasium.AsyncVectorEnv",
            "aenvs.ParallelEnv",
            "gymnasium.AsyncVectorEnv",
            None,
        ),
        ("drop-in SerialEnv / torchrl.SerialEnv", "aenvs.torchrl.SerialEnv", "torchrl.SerialEnv", 5.0),
        (
            "drop-in ParallelEnv / torchrl.ParallelEnv",
            "aenvs.torchrl.ParallelEnv",
            "torchrl.ParallelEnv",
            5.0,
        ),
        ("drop-in SerialEnv / aenvs.SerialEnv", "aenvs.torchrl.SerialEnv", "aenvs.SerialEnv", None),
        ("drop-in ParallelEnv / aenvs.ParallelEnv", "aenvs.torchrl.ParallelEnv", "aenvs.ParallelEnv", None),
        (
            "drop-in[gym] SerialEnv / torchrl.SerialEnv",
            "aenvs.torchrl.SerialEnv[gym]",
            "torchrl.SerialEnv",
            5.0,
        ),
        (
            "drop-in[gym] ParallelEnv / torchrl.ParallelEnv",
            "aenvs.torchrl.ParallelEnv[gym]",
            "torchrl.ParallelEnv",
            5.0,
        ),
    ]
    serial, sync = "aenvs.SerialEnv", "gymnasium.SyncVectorEnv"
    cpu_ratios = []
    for n in args.num_envs:
        x, y = results.get((serial, n)), results.get((sync, n))
        cpu_ratios.append(f"{y.cpu_us / x.cpu_us:.2f}x" if x and y else "n/a")
    print(
        f"{'by CPU time: SerialEnv / SyncVectorEnv':46s} "
        + "  ".join(f"N={n}: {v:>7s}" for n, v in zip(args.num_envs, cpu_ratios, strict=True))
        + "  (both in this process: immune to other jobs' load)"
    )
    for label, a, b, target in checks:
        values = [ratio(results, a, b, n) for n in args.num_envs]
        goal = f"  (target >= {target:.2f}x)" if target is not None else ""
        print(
            f"{label:46s} "
            + "  ".join(f"N={n}: {v:>7s}" for n, v in zip(args.num_envs, values, strict=True))
            + goal
        )


if __name__ == "__main__":  # process pools need the guard
    main()
