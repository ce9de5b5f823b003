"""Envs that connect in: CartPole simulators the trainer does not start (RLlib's external env).

The simulators are separate processes, each running CartPole episodes and asking a server
for every action through an ``aenvs.PolicyClient``, as a robot, a game or an LLM-agent
harness outside the training job would. The trainer serves them with ``aenvs.serve`` and
collects from the server's pool with the usual overlapped loop: each client episode is an
env of the pool; whichever envs are ready are stepped at once. When it has enough episodes
it closes the pool and the server; the simulators hear so (a ``PolicyServerError``) and stop.

Run, on one machine (the trainer starts the simulators, over loopback):
    python examples/external_env.py --simulators 4 --episodes 16

On two machines, with a token (AENVS_SERVE_TOKEN, the same on both) and TLS:
    trainer$   python examples/external_env.py --host 0.0.0.0 --port 8765 \
                   --certfile cert.pem --keyfile key.pem --slots 4 --simulators 0 --episodes 16
    simulator$ python examples/external_env.py --simulate wss://trainer.example:8765 --cafile cert.pem
"""

from __future__ import annotations

import argparse
import asyncio
import ssl
import sys
import time
from typing import TYPE_CHECKING

import gymnasium as gym

import aenvs

if TYPE_CHECKING:  # the trainer's batches hold torch tensors; the simulators never import torch
    import torch

MAX_STEPS = 200  # a simulator's time limit: its episodes end truncated there


# --8<-- [start:simulator]
def simulate(url: str, cafile: str | None) -> None:
    """A simulator: CartPole episodes until the server goes away.

    The token comes from AENVS_SERVE_TOKEN (or pass token=); ``cafile`` is the certificate
    to trust for a ``wss://`` url (a self-signed one; None: the system's authorities).
    """
    tls = None if cafile is None else ssl.create_default_context(cafile=cafile)
    env = gym.make("CartPole-v1", max_episode_steps=MAX_STEPS)
    with aenvs.PolicyClient(
        url, observation_space=env.observation_space, action_space=env.action_space, ssl=tls
    ) as client:  # connects here: a refused token or an untrusted certificate raises at once
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


# --8<-- [end:simulator]


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
    # --8<-- [start:server]
    tls = None
    if args.certfile:  # clients connect with wss:// and check this certificate
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(args.certfile, args.keyfile)
    # the token comes from AENVS_SERVE_TOKEN (or pass token=); a host other than loopback
    # without one is refused
    server = aenvs.serve(
        args.slots, obs_space, gym.spaces.Discrete(2), host=args.host, port=args.port, ssl=tls
    )
    async with server:
        print(f"serving {server.url}", flush=True)
        # --8<-- [end:server]
        simulators = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                __file__,
                "--simulate",
                server.url,
                *(["--cafile", args.cafile] if args.cafile else []),
            )
            for _ in range(args.simulators)
        ]
        async with server.pool() as pool:
            start = time.perf_counter()  # the simulators start meanwhile: the first reset waits for them
            returns = await collect(pool, args.episodes)
            elapsed = time.perf_counter() - start
    async with asyncio.timeout(30):
        exited = [await proc.wait() for proc in simulators]
    steps = sum(returns)  # CartPole pays 1 per step
    print(f"collected {len(returns)} episodes in {args.slots} env slots in {elapsed:.2f} s")
    print(f"mean return: {sum(returns) / len(returns):.1f} (at most {MAX_STEPS})")
    print(f"steps/s: {steps / elapsed:,.0f}")
    if simulators:
        print(f"simulators exited cleanly: {exited.count(0)}/{len(exited)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="CartPole simulators that connect in")
    parser.add_argument("--slots", type=int, default=4, help="env slots: client episodes run at once")
    parser.add_argument(
        "--simulators", type=int, help="simulator processes to start here (default: one per slot)"
    )
    parser.add_argument("--episodes", type=int, default=16, help="episodes to collect")
    parser.add_argument("--host", default="127.0.0.1", help="interface to serve on (0.0.0.0: every one)")
    parser.add_argument("--port", type=int, default=0, help="port to serve on (0: a free one)")
    parser.add_argument("--certfile", help="the server's TLS certificate (PEM); serve wss://")
    parser.add_argument("--keyfile", help="its private key (PEM)")
    parser.add_argument("--simulate", metavar="URL", help="run a simulator against the server at URL")
    parser.add_argument("--cafile", help="a simulator's certificate to trust (the server's, self-signed)")
    arguments = parser.parse_args()
    if arguments.simulators is None:
        arguments.simulators = arguments.slots
    if arguments.simulate:
        simulate(arguments.simulate, arguments.cafile)
    else:
        asyncio.run(main(arguments))
