"""A pool whose envs run on a Ray cluster: two simulated nodes on this machine.

``ray.cluster_utils.Cluster`` starts a head node and a second node (each with its own
raylet and 2 CPUs), as a real cluster would have on two machines. The pool connects to
it and ``RayExecutor`` puts its actors on both nodes (Ray's SPREAD strategy); an asyncio
loop then steps the envs, re-sending each env as soon as its result comes back, while
the others are still stepping.

On a real cluster, skip the ``Cluster`` and give the pool the cluster's address:
``RayExecutor(address="ray-head:6379")`` (or set ``RAY_ADDRESS``).

Run:
    python examples/ray_cluster.py --num-envs 8 --steps 2000
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time

# this demo cluster stays on loopback: Ray binds to the machine's address otherwise
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

import ray
import torch
from ray.cluster_utils import Cluster

from aenvs import AsyncEnvPool
from aenvs.executors import RayExecutor


async def run(num_envs: int, steps: int) -> None:
    # two actors per node, one CPU each: SPREAD alternates them over the nodes
    executor = RayExecutor(num_workers=4, num_cpus=1)
    async with AsyncEnvPool("CartPole-v1", num_envs=num_envs, executor=executor, seed=0) as pool:
        by_node: dict[str, list[int]] = {}
        for env, node in executor.nodes.items():
            by_node.setdefault(node, []).append(env)
        for node, envs in sorted(by_node.items()):
            print(f"node {node[:12]}: envs {envs}")

        td = await pool.reset()
        td["action"] = torch.randint(0, 2, (num_envs,))
        await pool.async_step_and_maybe_reset_send(td)
        done, episodes, start = 0, 0, time.perf_counter()
        while done < steps:
            # whichever envs finished, on whichever node; the rest keep stepping meanwhile
            out, next_td = await pool.async_step_and_maybe_reset_recv(min_get=1)
            done += out.batch_size[0]
            episodes += int(out["next", "done"].sum())
            next_td["action"] = torch.randint(0, 2, (next_td.batch_size[0],))
            await pool.async_step_and_maybe_reset_send(next_td)
        elapsed = time.perf_counter() - start
        await pool.async_step_and_maybe_reset_recv(min_get=num_envs)  # the steps still in flight
    print(f"steps: {done}, episodes: {episodes}, steps/s: {done / elapsed:,.0f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2000, help="env steps in all")
    args = parser.parse_args()

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)  # the second "machine"
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level=logging.ERROR)
    try:
        print(f"cluster: {len(ray.nodes())} nodes, {int(ray.cluster_resources()['CPU'])} CPUs")
        asyncio.run(run(args.num_envs, args.steps))
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
