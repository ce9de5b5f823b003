"""The ray executor on a cluster of two simulated nodes (``ray.cluster_utils.Cluster``).

A driver connects to one cluster at a time: this module replaces the session's one-node
cluster by a two-node one (GCS health checks every 0.5 s, so a node that disappears is
declared dead in about 2 s), and the session's cluster starts again after it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any, Literal

import psutil
import pytest

from aenvs import AsyncEnvPool, EnvCrashedError
from aenvs.executors import RayExecutor
from aenvs.testing import echo_env_fns
from tests.helpers import Gate, actions, assert_gone, gated_env_fns
from tests.ray_session import LOCAL_RAY, NODE_OPTIONS, actors_left

WAIT = 30.0
DEATH_DETECTION = {
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 3,
}
EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def cluster() -> Any:
    cluster = LOCAL_RAY.start(num_nodes=2, system_config=DEATH_DETECTION)
    yield cluster
    LOCAL_RAY.suspend()


@pytest.fixture
def two_nodes(cluster: Any) -> Any:
    """The cluster, with a second node again if a test removed it."""
    if not cluster.worker_nodes:
        cluster.wait_for_nodes()  # until Ray has declared the removed node dead: nothing lands there
        cluster.add_node(**NODE_OPTIONS)
    cluster.wait_for_nodes()
    return cluster


def spread_executor(**options: Any) -> RayExecutor:
    """Two actors holding one CPU each: Ray's SPREAD strategy puts one on each node."""
    return RayExecutor(num_workers=2, num_cpus=1, **options)


def _head_and_worker(cluster: Any, executor: RayExecutor) -> tuple[list[int], list[int]]:
    """The envs on the head node and those on the other node."""
    head = cluster.head_node.node_id
    on_head = sorted(i for i, node in executor.nodes.items() if node == head)
    elsewhere = sorted(i for i, node in executor.nodes.items() if node != head)
    return on_head, elsewhere


async def test_envs_are_spread_over_both_nodes_and_step(two_nodes: Any) -> None:
    executor = spread_executor()
    async with AsyncEnvPool(echo_env_fns(4), executor=executor) as pool:
        on_head, elsewhere = _head_and_worker(two_nodes, executor)
        assert on_head and elsewhere, executor.nodes
        await pool.reset()
        for step in range(1, 4):
            out = await pool.step(actions([1, 2, 3, 4]))
            assert out["next", "observation"][:, 0].tolist() == [0, 1, 2, 3]
            assert out["next", "observation"][:, 2].tolist() == [step] * 4


async def test_killing_an_actor_mid_step_crashes_exactly_its_envs(two_nodes: Any, tmp_path) -> None:
    gate = Gate(str(tmp_path))
    executor = spread_executor()
    async with AsyncEnvPool(gated_env_fns(4, gate), executor=executor) as pool:
        on_head, elsewhere = _head_and_worker(two_nodes, executor)
        await pool.reset()
        await pool.async_step_send(actions([1, 2, 3, 4]))
        victim = executor._worker_of[elsewhere[0]].pid
        psutil.Process(victim).kill()
        crashed = []
        async with asyncio.timeout(WAIT):
            while len(crashed) < len(elsewhere):
                with pytest.raises(EnvCrashedError) as info:
                    await pool.async_step_recv(min_get=1)
                crashed.append(info.value.env_index)
        assert sorted(crashed) == elsewhere
        gate.open()
        out = await pool.async_step_recv(min_get=len(on_head), timeout=WAIT)
        assert out["env_index"].tolist() == on_head
        for _ in range(2):  # the others keep stepping
            out = await pool.step(actions([7.0] * len(on_head), env_index=on_head))
            assert out["next", "observation"][:, 1].tolist() == [7.0] * len(on_head)
    assert_gone([victim], timeout=WAIT)


@pytest.mark.parametrize("on_error", ["raise", "restart"])
async def test_removing_a_node_crashes_its_envs_within_the_recv_timeout(
    two_nodes: Any, tmp_path, on_error: Literal["raise", "restart"]
) -> None:
    gate = Gate(str(tmp_path))
    executor = spread_executor()
    async with AsyncEnvPool(
        gated_env_fns(4, gate), executor=executor, on_error=on_error, restart_backoff=0
    ) as pool:
        on_head, elsewhere = _head_and_worker(two_nodes, executor)
        assert on_head and elsewhere, executor.nodes
        head = two_nodes.head_node.node_id
        await pool.reset()
        await pool.async_step_send(actions([1, 2, 3, 4]))  # held at the gate: in flight everywhere
        (worker_node,) = list(two_nodes.worker_nodes)
        two_nodes.remove_node(worker_node, allow_graceful=False)
        crashed = []
        while len(crashed) < len(elsewhere):  # every wait bounded by the recv timeout: never a hang
            with pytest.raises(EnvCrashedError) as info:
                await pool.async_step_recv(min_get=1, timeout=WAIT)
            crashed.append(info.value.env_index)
            assert "ray" in str(info.value) and "died" in info.value.remote_traceback
        assert sorted(crashed) == elsewhere
        gate.open()
        out = await pool.async_step_recv(min_get=len(on_head), timeout=WAIT)
        assert out["env_index"].tolist() == on_head
        if on_error == "restart":  # rebuilt on the node that is left; stepping again after a reset
            td = await asyncio.wait_for(pool.reset(), WAIT)
            assert td["env_index"].tolist() == [0, 1, 2, 3]
            assert set(executor.nodes.values()) == {head}
            out = await pool.step(actions([1, 2, 3, 4]))
            assert out["next", "observation"][:, 1].tolist() == [1, 2, 3, 4]
            assert out["next", "observation"][:, 2].tolist() == [1, 1, 1, 1]
            # a first attempt may land on the removed node before Ray has declared it dead
            restarts = pool.stats().restarts
            assert all(restarts[i] >= 1 for i in elsewhere) and all(restarts[i] == 0 for i in on_head)
        else:
            with pytest.raises(EnvCrashedError):
                await pool.reset(env_index=elsewhere)
            out = await pool.step(actions([5.0] * len(on_head), env_index=on_head))
            assert out["next", "observation"][:, 1].tolist() == [5.0] * len(on_head)


async def test_close_leaves_no_actor_and_the_cluster_running(two_nodes: Any) -> None:
    import ray

    executor = spread_executor()
    async with AsyncEnvPool(echo_env_fns(4), executor=executor) as pool:
        await pool.reset()
        assert sorted(actors_left()) == sorted(executor.actor_names)
        pids = executor.pids
    assert actors_left() == []
    assert_gone(pids, timeout=WAIT)
    assert ray.is_initialized()
    assert sum(n["Alive"] for n in ray.nodes()) == 2


def test_example_runs_a_pool_over_two_simulated_nodes() -> None:
    """examples/ray_cluster.py starts a cluster of its own: a driver of its own, in its own process."""
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "ray_cluster.py"), "--num-envs", "4", "--steps", "200"],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    hosting = [line for line in out.splitlines() if line.startswith("node ")]
    assert len(hosting) == 2, out  # envs on both nodes
    assert "steps: 200" in out or "steps:" in out, out
