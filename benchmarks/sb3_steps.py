"""Stable-Baselines3's vector envs against ``aenvs.sb3.VecEnv``, on CartPole-v1.

For each vector env, in alternating rounds (each round runs every vector env once, in
turn, so that a busy spell of a shared machine falls on all of them):

- ``random``: env steps per second of a ``VecEnv.step`` loop of random actions drawn
  beforehand (SB3's auto-reset included), after a warm-up;
- ``ppo``: env steps per second of PPO's rollout collection (``collect_rollouts``: the
  policy's forward pass, the step, the rollout buffer), training left out;
- CPU: microseconds of CPU per env step, of this process and every process it started
  (workers included), the whole cost on a shared machine.

Compared: SB3's ``DummyVecEnv`` (in this process) and ``SubprocVecEnv`` (a process per
env), and ``aenvs.sb3.VecEnv`` on the inline and the process executors. Each figure is
the median of the rounds.

Run:
    python benchmarks/sb3_steps.py --num-envs 4 --steps 5000 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv as SB3VecEnv

from aenvs.sb3 import VecEnv

ENV_ID = "CartPole-v1"


def make_env() -> gym.Env[Any, Any]:
    return gym.make(ENV_ID)


VEC_ENVS: dict[str, Callable[[int], SB3VecEnv]] = {
    "DummyVecEnv": lambda n: DummyVecEnv([make_env] * n),
    "SubprocVecEnv": lambda n: SubprocVecEnv([make_env] * n),
    "aenvs.sb3.VecEnv inline": lambda n: VecEnv([make_env] * n, executor="inline"),
    "aenvs.sb3.VecEnv process": lambda n: VecEnv([make_env] * n, executor="process"),
}


def cpu_seconds() -> float:
    """CPU seconds of this process and every process below it (the workers)."""
    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            t = process.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def timed(fn: Callable[[], None]) -> tuple[float, float]:
    """Wall and CPU seconds of ``fn()``."""
    c0, t0 = cpu_seconds(), time.perf_counter()
    fn()
    return time.perf_counter() - t0, cpu_seconds() - c0


def random_loop(env: SB3VecEnv, steps: int) -> Callable[[], None]:
    actions = np.random.default_rng(0).integers(0, 2, (steps, env.num_envs))

    def run() -> None:
        for action in actions:
            env.step(action)

    return run


def ppo_collection(env: SB3VecEnv, steps: int) -> Callable[[], None]:
    """One ``collect_rollouts`` of ``steps`` env steps (``n_steps`` per env)."""
    model = PPO("MlpPolicy", env, n_steps=steps // env.num_envs, device="cpu", seed=0)
    _, callback = model._setup_learn(steps)  # pyright: ignore[reportPrivateUsage]
    callback.on_training_start(locals(), globals())

    def run() -> None:
        assert model.env is not None
        model.collect_rollouts(model.env, callback, model.rollout_buffer, model.n_steps)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5000, help="env steps per timed loop")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = args.num_envs
    envs = {name: make(n) for name, make in VEC_ENVS.items()}
    loops: dict[tuple[str, str], Callable[[], None]] = {}
    for name, env in envs.items():
        env.seed(0)
        env.reset()
        loops["random", name] = random_loop(env, args.steps // n)
        loops["ppo", name] = ppo_collection(env, args.steps)
        for loop in (loops["random", name], loops["ppo", name]):
            loop()  # warm-up
    results: dict[tuple[str, str], list[tuple[float, float]]] = {key: [] for key in loops}
    for _ in range(args.rounds):
        for key, loop in loops.items():
            results[key].append(timed(loop))
    for env in envs.values():
        env.close()

    print(f"{ENV_ID}, {n} envs, {args.steps} env steps per loop, median of {args.rounds} alternating rounds")
    print(f"{'workload':<8} {'vector env':<26} {'steps/s':>9} {'CPU us/step':>12}")
    for (workload, name), runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"{workload:<8} {name:<26} {args.steps / wall:>9,.0f} {1e6 * cpu / args.steps:>12.1f}")


if __name__ == "__main__":
    main()
