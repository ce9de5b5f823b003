"""Many simulators connect in at once: every transition reaches the pool exactly once.

The server's env slots are coroutines on the pool's loop, so the inline executor is their
executor (the others are refused, see test_server_lifecycle.py); these run on both event loops.
"""

from __future__ import annotations

import asyncio
import random
import threading

import pytest

import aenvs
from aenvs import AsyncPolicyClient, PolicyClient
from tests.serving.support import TEXT, WAIT, Step, policy, train

Plan = list[tuple[int, bool]]  # per episode: steps, and whether it ends truncated


def plans(clients: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    return [
        [(rng.randint(1, 3), rng.random() < 0.3) for _ in range(rng.randint(2, 3))] for _ in range(clients)
    ]


async def run_client(
    client: AsyncPolicyClient | PolicyClient, name: str, plan: Plan
) -> dict[str, list[Step]]:
    """Play ``plan`` (sync clients through a thread); returns per episode what the client saw."""
    seen: dict[str, list[Step]] = {}
    for e, (steps, truncated) in enumerate(plan):
        eid = await _call(client.start_episode, f"{name}-{e}")
        obs = f"{name}-{e}-0"
        seen[eid] = []
        for k in range(steps):
            action = await _call(client.get_action, eid, obs)
            assert action == policy(obs), f"{eid} step {k}: got {action!r} for {obs!r}"
            reward = 0.5 * k  # logged in two parts: their sum is the step's reward
            await _call(client.log_returns, eid, reward, {"part": 1.0})
            await _call(client.log_returns, eid, 1.0)
            nxt = f"{name}-{e}-{k + 1}"
            last = k == steps - 1
            seen[eid].append(
                Step(obs, action, reward + 1.0, nxt, last and not truncated, last and truncated, False)
            )
            if last:
                await _call(client.end_episode, eid, nxt, truncated)
            obs = nxt
    return seen


async def _call(method, *args):
    if isinstance(method.__self__, PolicyClient):
        return await asyncio.to_thread(method, *args)
    return await method(*args)


async def test_256_clients_queue_for_64_slots_and_every_transition_arrives_once() -> None:
    all_plans = plans(256, seed=19)
    server = aenvs.serve(64, TEXT, TEXT)
    async with server, server.pool() as pool:
        clients = [AsyncPolicyClient(server.url) for _ in range(256)]
        tasks = [
            asyncio.create_task(run_client(client, f"c{n}", plan))
            for n, (client, plan) in enumerate(zip(clients, all_plans, strict=True))
        ]
        trained = await train(pool, sum(len(plan) for plan in all_plans))
        async with asyncio.timeout(WAIT):
            sent = await asyncio.gather(*tasks)
        for client in clients:
            await client.close()
        assert server.num_open_episodes == 0 and server.num_queued == 0
    client_seen = {eid: steps for seen in sent for eid, steps in seen.items()}
    assert trained.steps == client_seen  # every step, once, in order, with its summed reward
    assert trained.first == {eid: steps[0].observation for eid, steps in client_seen.items()}


async def test_one_client_runs_episodes_concurrently_and_the_info_arrives() -> None:
    server = aenvs.serve(4, TEXT, TEXT)
    async with server, server.pool() as pool, AsyncPolicyClient(server.url) as client:
        tasks = [asyncio.create_task(run_client(client, f"k{n}", [(2, False)])) for n in range(6)]
        trained = await train(pool, 6)
        async with asyncio.timeout(WAIT):
            sent = await asyncio.gather(*tasks)
    assert trained.steps == {eid: steps for seen in sent for eid, steps in seen.items()}


async def test_a_sync_client_in_a_thread() -> None:
    server = aenvs.serve(2, TEXT, TEXT)
    async with server, server.pool() as pool:
        results: list[dict[str, list[Step]]] = []
        errors: list[BaseException] = []

        def simulate() -> None:
            try:
                with PolicyClient(server.url) as client:
                    results.append(asyncio.run(run_client(client, "sync", [(3, False), (1, True)])))
            except BaseException as exc:  # reported by the test, not lost in the thread
                errors.append(exc)

        thread = threading.Thread(target=simulate)
        thread.start()
        trained = await train(pool, 2)
        await asyncio.to_thread(thread.join, WAIT)
        assert not thread.is_alive() and not errors, errors
    assert trained.steps == results[0]
    assert [len(steps) for steps in trained.steps.values()] == [3, 1]


@pytest.mark.parametrize("truncated", [False, True])
async def test_returns_logged_before_the_first_action_count_in_the_first_step(truncated: bool) -> None:
    server = aenvs.serve(1, TEXT, TEXT)
    async with server, server.pool() as pool, AsyncPolicyClient(server.url) as client:
        eid = await client.start_episode()
        await client.log_returns(eid, 2.0)
        waiter = asyncio.create_task(client.get_action(eid, "s0"))
        td = await pool.reset()
        assert td["info", "episode_id"].tolist() == [eid]
        td["action"] = ["go"]
        await pool.async_step_send(td)
        assert await asyncio.wait_for(waiter, WAIT) == "go"
        await client.log_returns(eid, 3.0)
        await client.end_episode(eid, "s1", truncated=truncated)
        out = await pool.async_step_recv(min_get=1, timeout=WAIT)
    assert out["next", "reward"].tolist() == [[5.0]]
    assert out["next", "terminated"].tolist() == [[not truncated]]
    assert out["next", "truncated"].tolist() == [[truncated]]
