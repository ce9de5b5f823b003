"""Simulators that die mid-episode (SIGKILL, a connection cut or closed) end their episode
as truncated at once; the pool goes on and their slots serve the next clients."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aenvs
from aenvs import AsyncPolicyClient
from tests.serving.support import TEXT, WAIT, RawClient, policy, train, until
from tests.serving.test_many_clients import run_client

SIM_CLIENT = str(Path(__file__).with_name("sim_client.py"))


async def killed_once_acting(url: str) -> str:
    """Run sim_client.py; SIGKILL it once it holds its first action; return its episode id."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, SIM_CLIENT, url, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        async with asyncio.timeout(WAIT):
            line = (await proc.stdout.readline()).decode().split()
        assert line[0] == "acting" and line[2] == policy("sub0"), line
        return line[1]
    finally:
        proc.kill()
        async with asyncio.timeout(WAIT):
            await proc.wait()


async def cut_once_acting(url: str, name: str) -> str:
    """A client whose connection is cut (no close handshake) once it holds its first action."""
    raw = await RawClient.connect(url)
    await raw.send({"type": "start_episode", "episode_id": name})
    await raw.send({"type": "get_action", "episode_id": name, "observation": f"{name}-0"})
    assert (await raw.recv())["action"] == policy(f"{name}-0")
    transport = raw.ws.transport
    assert transport is not None
    transport.abort()
    return name


async def closed_once_acting(url: str, name: str) -> str:
    """A client that closes its connection (cleanly) once it holds its first action."""
    client = AsyncPolicyClient(url)
    await client.start_episode(name)
    assert await client.get_action(name, f"{name}-0") == policy(f"{name}-0")
    await client.close()
    return name


async def test_clients_that_die_mid_episode_end_truncated_and_their_slots_serve_the_next() -> None:
    server = aenvs.serve(4, TEXT, TEXT)
    async with server, server.pool() as pool:
        url = server.url
        dying = [
            asyncio.create_task(killed_once_acting(url)),
            asyncio.create_task(killed_once_acting(url)),
            asyncio.create_task(cut_once_acting(url, "cut")),
            asyncio.create_task(closed_once_acting(url, "closed")),
        ]
        clients = [AsyncPolicyClient(url) for _ in range(4)]
        living = [asyncio.create_task(run_client(c, f"ok{n}", [(2, False)])) for n, c in enumerate(clients)]
        trained = await train(pool, 8)
        async with asyncio.timeout(WAIT):
            died = await asyncio.gather(*dying)
            lived = await asyncio.gather(*living)
        for client in clients:
            await client.close()
        assert server.num_open_episodes == 0
    for eid in died:
        [step] = trained.steps[eid]  # ended at the step its client died in
        assert step.truncated and not step.terminated and step.disconnected
        assert step.next_observation == step.observation == trained.first[eid]  # its last observation
        assert step.reward == 0.0
    assert {eid: steps for seen in lived for eid, steps in seen.items()} == {
        eid: steps for eid, steps in trained.steps.items() if eid not in died
    }


async def test_a_client_gone_while_queued_never_reaches_the_pool() -> None:
    server = aenvs.serve(1, TEXT, TEXT)
    async with server, server.pool() as pool, AsyncPolicyClient(server.url) as first:
        await first.start_episode("first")
        waiter = asyncio.create_task(first.get_action("first", "f0"))
        td = await pool.reset()
        assert td["info", "episode_id"].tolist() == ["first"]
        queued = await RawClient.connect(server.url)  # queued behind "first", then gone
        await queued.send({"type": "start_episode", "episode_id": "queued"})
        await queued.send({"type": "get_action", "episode_id": "queued", "observation": "q0"})
        await until(lambda: server.num_queued == 1)
        await queued.ws.close()
        await until(lambda: server.num_queued == 0)
        td["action"] = ["go"]
        await pool.async_step_send(td)
        assert await asyncio.wait_for(waiter, WAIT) == "go"
        await first.end_episode("first", "f1")
        out = await pool.async_step_recv(min_get=1, timeout=WAIT)
        assert out["next", "terminated"].tolist() == [[True]]
        later = asyncio.create_task(run_client(first, "later", [(1, False)]))
        td = await pool.reset(env_index=[0])
        assert td["info", "episode_id"].tolist() == ["later-0"]  # not "queued"
        td["action"] = [policy("later-0-0")]
        out = await pool.step(td)
        assert out["next", "terminated"].tolist() == [[True]]
        await asyncio.wait_for(later, WAIT)
