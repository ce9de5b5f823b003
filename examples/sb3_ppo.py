"""Stable-Baselines3 PPO on CartPole-v1, its envs on aenvs: SB3's usual script, one line changed.

The line that builds the vector env names aenvs' class instead of SB3's::

    vec_env = make_vec_env("CartPole-v1", n_envs=4, seed=0, vec_env_cls=SubprocVecEnv)  # SB3's
    vec_env = make_vec_env("CartPole-v1", n_envs=4, seed=0, vec_env_cls=VecEnv)  # aenvs

``aenvs.sb3.VecEnv`` is a real SB3 ``VecEnv`` (``pip install aenvs[sb3]``): ``PPO``,
``VecNormalize``, ``VecMonitor``, ``evaluate_policy`` take it as they take SB3's own.

    python examples/sb3_ppo.py                               # process executor, 100k steps
    python examples/sb3_ppo.py --executor inline --total-timesteps 20000
    python examples/sb3_ppo.py --vec-env subproc             # SB3's SubprocVecEnv, to compare

Prints the steps, the wall time and steps/s of training, and the mean return of 10
evaluation episodes (CartPole's best is 500).
"""

from __future__ import annotations

import argparse
import time

import torch
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecNormalize

from aenvs.sb3 import VecEnv

PEERS = {"subproc": SubprocVecEnv, "dummy": DummyVecEnv}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env-id", default="CartPole-v1")
    parser.add_argument("--total-timesteps", type=int, default=100_000)
    parser.add_argument("--executor", default="process", choices=["inline", "thread", "process", "ray"])
    parser.add_argument("--vec-env", default="aenvs", choices=["aenvs", "subproc", "dummy"])
    parser.add_argument("--n-steps", type=int, default=32, help="steps per env per rollout")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)  # a small MLP: torch's threads would fight the envs for the cores

    on = {"executor": args.executor}
    if args.vec_env == "aenvs":
        # the one line that differs from SB3's script, which reads vec_env_cls=SubprocVecEnv
        vec_env = make_vec_env(
            args.env_id,
            n_envs=4,
            seed=args.seed,
            vec_env_cls=VecEnv,  # pyright: ignore[reportArgumentType] (SB3 types it as its own two)
            vec_env_kwargs=on,
        )
    else:  # SB3's own, for comparison
        vec_env = make_vec_env(args.env_id, n_envs=4, seed=args.seed, vec_env_cls=PEERS[args.vec_env])
    env = VecNormalize(vec_env, gamma=0.98)

    # rl-baselines3-zoo's CartPole hyperparameters
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=args.n_steps,
        batch_size=min(256, 4 * args.n_steps),
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=1e-3,
        clip_range=0.2,
        seed=args.seed,
        device="cpu",
    )
    name = (
        f"aenvs.sb3.VecEnv ({args.executor} executor)" if args.vec_env == "aenvs" else type(vec_env).__name__
    )
    print(f"PPO on {args.env_id}, 4 envs, {name}")
    start = time.perf_counter()
    model.learn(total_timesteps=args.total_timesteps)
    seconds = time.perf_counter() - start
    print(
        f"steps: {model.num_timesteps:,}  wall time: {seconds:.1f} s  ({model.num_timesteps / seconds:,.0f} steps/s)"
    )

    env.training = False  # evaluate with the statistics learnt, unchanged
    env.norm_reward = False
    mean, std = evaluate_policy(model, env, n_eval_episodes=10)
    print(f"mean return of 10 evaluation episodes: {mean:.1f} +- {std:.1f}")
    env.close()


if __name__ == "__main__":
    main()
