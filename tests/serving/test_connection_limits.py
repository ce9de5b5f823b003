"""Per-connection limits: a client over one hears which and its connection closes (1008, 1009
for size); the server, the pool and the other clients carry on with nothing lost."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

import aenvs
from aenvs import AsyncPolicyClient, PolicyClient, PolicyServerError
from tests.serving.support import TEXT, WAIT, RawClient, policy, train, until
from tests.serving.test_many_clients import plans, run_client

TOKEN = "flood-test-token-4Kq9"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
RATE = 100  # messages a second; a well-behaved client here sends at most 33 in all


async def flood(url: str, name: str, messages: int) -> tuple[int | None, list[dict[str, Any]]]:
    """An authenticated client that starts an episode and sends ``messages`` log_returns as fast
    as it can; returns its close code and what the server said."""
    raw = await RawClient.connect(url, headers=BEARER)
    heard: list[dict[str, Any]] = []

    async def listen() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for text in raw.ws:  # one by one: the close (1008) raises at the end
                heard.append(json.loads(text))  # noqa: PERF401

    listener = asyncio.create_task(listen())
    with contextlib.suppress(ConnectionClosed):
        await raw.send({"type": "start_episode", "episode_id": name})
        for _ in range(messages):
            await raw.send({"type": "log_returns", "episode_id": name, "reward": 1.0})
    code, _ = await raw.closed()
    await asyncio.wait_for(listener, WAIT)
    return code, heard


async def hoard(url: str, name: str, episodes: int) -> tuple[int | None, list[dict[str, Any]]]:
    """An authenticated client that starts ``episodes`` episodes and ends none."""
    raw = await RawClient.connect(url, headers=BEARER)
    with contextlib.suppress(ConnectionClosed):
        for n in range(episodes):
            await raw.send({"type": "start_episode", "episode_id": f"{name}-{n}"})
    answer = await raw.recv()
    return (await raw.closed())[0], [answer]


async def knock(url: str, n: int) -> int:
    """A connection attempt without the token (every other one with a wrong one): its HTTP status."""
    headers = None if n % 2 else {"Authorization": f"Bearer wrong-{n}"}
    try:
        raw = await RawClient.connect(url, headers=headers)
    except InvalidStatus as exc:
        return exc.response.status_code
    await raw.ws.close()
    return 101


async def test_a_flood_of_connections_and_messages_leaves_the_good_clients_whole() -> None:
    all_plans = plans(5, seed=48)
    server = aenvs.serve(
        3, TEXT, TEXT, token=TOKEN, max_messages_per_second=RATE, max_episodes_per_connection=8
    )
    async with server, server.pool() as pool:
        good = [AsyncPolicyClient(server.url, token=TOKEN) for _ in range(4)]
        good.append(PolicyClient(server.url, token=TOKEN))  # type: ignore[arg-type]
        playing = [
            asyncio.create_task(run_client(client, f"g{n}", plan))
            for n, (client, plan) in enumerate(zip(good, all_plans, strict=True))
        ]
        knocks = [asyncio.create_task(knock(server.url, n)) for n in range(100)]
        floods = [asyncio.create_task(flood(server.url, f"flood-{n}", 50 * RATE)) for n in range(3)]
        hoards = [asyncio.create_task(hoard(server.url, f"hoard-{n}", 9)) for n in range(2)]

        trained = await train(pool, sum(len(plan) for plan in all_plans))
        async with asyncio.timeout(WAIT):
            sent = await asyncio.gather(*playing)
            statuses = await asyncio.gather(*knocks)
            flooded = await asyncio.gather(*floods)
            hoarded = await asyncio.gather(*hoards)
        for client in good:
            await (asyncio.to_thread(client.close) if isinstance(client, PolicyClient) else client.close())
        await until(lambda: server.num_connections == 0 and server.num_open_episodes == 0)
    assert statuses == [401] * 100
    for code, heard in flooded:
        assert code == 1008
        assert heard[-1]["type"] == "error" and "max_messages_per_second" in heard[-1]["message"], heard[-1:]
    for code, heard in hoarded:
        assert code == 1008 and "max_episodes_per_connection" in heard[0]["message"], heard
    # every step of the well-behaved clients, once, in order; nothing of the others
    assert trained.steps == {eid: steps for seen in sent for eid, steps in seen.items()}


async def test_a_connection_over_its_message_rate_is_closed_and_its_episode_ends() -> None:
    server = aenvs.serve(1, TEXT, TEXT, max_messages_per_second=5)
    async with server, server.pool() as pool:
        raw = await RawClient.connect(server.url)
        await raw.send({"type": "start_episode", "episode_id": "fast"})
        await raw.send({"type": "get_action", "episode_id": "fast", "observation": "f0"})
        td = await pool.reset()
        td["action"] = ["go"]
        await pool.async_step_send(td)
        assert (await raw.recv())["action"] == "go"
        with contextlib.suppress(ConnectionClosed):
            for _ in range(1000):
                await raw.send({"type": "log_returns", "episode_id": "fast", "reward": 1.0})
        answer = await raw.recv()
        assert answer["type"] == "error" and "more than 5 messages a second" in answer["message"], answer
        assert (await raw.closed())[0] == 1008
        out = await pool.async_step_recv(min_get=1, timeout=WAIT)
        assert out["next", "truncated"].tolist() == [[True]]
        assert out["next", "info", "disconnected"].tolist() == [True]


async def test_ended_episodes_free_their_place_under_the_episode_limit() -> None:
    server = aenvs.serve(1, TEXT, TEXT, max_episodes_per_connection=2)
    async with server, server.pool() as pool, AsyncPolicyClient(server.url) as client:
        task = asyncio.create_task(run_client(client, "seq", [(1, False)] * 4))
        trained = await train(pool, 4)
        async with asyncio.timeout(WAIT):
            assert trained.steps == await task
        await client.start_episode("a")
        await client.start_episode("b")
        await client.start_episode("c")  # sends and returns; the refusal comes back
        with pytest.raises(PolicyServerError, match=r"2 episodes are open on this connection.*max_episodes"):
            await asyncio.wait_for(client.get_action("a", "a0"), WAIT)
        await until(lambda: server.num_connections == 0 and server.num_open_episodes == 0)


async def test_an_idle_connection_is_closed_and_one_waiting_for_its_action_is_not() -> None:
    server = aenvs.serve(1, TEXT, TEXT, idle_timeout=0.3)
    async with server, server.pool() as pool, AsyncPolicyClient(server.url) as waiting:
        eid = await waiting.start_episode()
        action = asyncio.create_task(waiting.get_action(eid, "w0"))
        await until(lambda: server.num_queued == 1)  # its last message is in: it waits for the trainer
        idle = await RawClient.connect(server.url)  # silent from now on, which is later
        answer = await idle.recv()
        assert answer["type"] == "error" and "idle for 0.3 s" in answer["message"], answer
        assert (await idle.closed())[0] == 1008
        # the waiting client was silent longer, and is served
        td = await pool.reset()
        td["action"] = [policy("w0")]
        await pool.async_step_send(td)
        assert await asyncio.wait_for(action, WAIT) == policy("w0")
        await waiting.end_episode(eid, "w1")
        out = await pool.async_step_recv(min_get=1, timeout=WAIT)
        assert out["next", "terminated"].tolist() == [[True]]
        # with nothing left to wait for, its silence counts too
        await until(lambda: server.num_connections == 0)
        with pytest.raises(PolicyServerError, match=r"closed this client's connection: idle for 0\.3 s"):
            await waiting.start_episode()


async def test_a_message_over_the_size_limit_closes_its_connection_only() -> None:
    server = aenvs.serve(1, TEXT, TEXT, max_message_size=1000)
    async with server, server.pool() as pool, AsyncPolicyClient(server.url) as good:
        raw = await RawClient.connect(server.url)
        await raw.send({"type": "start_episode", "episode_id": "big", "padding": "x" * 2000})
        assert (await raw.closed())[0] == 1009
        task = asyncio.create_task(run_client(good, "good", [(1, False)]))
        trained = await train(pool, 1)
        async with asyncio.timeout(WAIT):
            assert trained.steps == await task


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_episodes_per_connection": 0}, "max_episodes_per_connection must be a positive int"),
        ({"max_episodes_per_connection": 2.5}, "max_episodes_per_connection must be a positive int"),
        ({"max_messages_per_second": -1}, "max_messages_per_second must be a positive number"),
        ({"idle_timeout": float("inf")}, "idle_timeout must be a positive number"),
        ({"idle_timeout": True}, "idle_timeout must be a positive number"),
    ],
)
def test_bad_limits_are_refused_naming_them(kwargs: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        aenvs.serve(1, TEXT, TEXT, **kwargs)
