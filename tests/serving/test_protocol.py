"""Messages that break the protocol: the client gets an error and its connection closes;
the server and the pool carry on."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import aenvs
from aenvs import AsyncPolicyClient
from tests.serving.support import TEXT, WAIT, RawClient, policy, until
from tests.serving.test_many_clients import run_client

START = {"type": "start_episode", "episode_id": "e"}
ASK = {"type": "get_action", "episode_id": "e", "observation": "x"}

BAD: dict[str, tuple[list[dict[str, Any]], dict[str, Any] | str | bytes, str]] = {
    "not json": ([], "{nope", "not valid JSON"),
    "not an object": ([], "[1]", 'JSON object with a "type"'),
    "binary": ([], b"\x00", "binary frame"),
    "unknown type": ([], {"type": "fly", "episode_id": "e"}, "unknown message type 'fly'"),
    "no episode id": ([], {"type": "get_action", "observation": "x"}, '"episode_id" string'),
    "unknown episode": ([], ASK, "no open episode 'e'"),
    "started twice": ([START], START, "already open"),
    "no observation": ([START], {"type": "get_action", "episode_id": "e"}, 'needs an "observation"'),
    "observation outside its space": ([START], {**ASK, "observation": "a b"}, "does not fit"),
    "observation of the wrong type": ([START], {**ASK, "observation": 5}, "does not fit"),
    "asked twice": ([START, ASK], ASK, "awaits its action"),
    "reward not a number": ([START], {"type": "log_returns", "episode_id": "e", "reward": "lots"}, "finite"),
    "info not an object": (
        [START],
        {"type": "log_returns", "episode_id": "e", "reward": 1, "info": 3},
        "object",
    ),
    "truncated not a bool": (
        [START],
        {"type": "end_episode", "episode_id": "e", "observation": "x", "truncated": "yes"},
        "true or false",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_a_message_breaking_the_protocol_closes_its_connection_only(case: str) -> None:
    before, bad, error = BAD[case]
    server = aenvs.serve(1, TEXT, TEXT)
    async with server, server.pool() as pool, AsyncPolicyClient(server.url) as good:
        raw = await RawClient.connect(server.url)
        for message in before:
            await raw.send(message)
        await raw.send(bad)
        answer = await raw.recv()
        assert answer["type"] == "error" and error in answer["message"], answer
        assert (await raw.closed())[0] == 1008
        await until(lambda: server.num_connections == 1 and server.num_open_episodes == 0)
        # the server and the pool go on
        task = asyncio.create_task(run_client(good, "good", [(1, False)]))
        td = await pool.reset()
        td["action"] = [policy("good-0-0")]
        out = await pool.step(td)
        assert out["next", "terminated"].tolist() == [[True]]
        await asyncio.wait_for(task, WAIT)


async def test_a_client_breaking_the_protocol_mid_episode_ends_it_truncated() -> None:
    server = aenvs.serve(1, TEXT, TEXT)
    async with server, server.pool() as pool:
        raw = await RawClient.connect(server.url)
        await raw.send(START)
        await raw.send(ASK)
        td = await pool.reset()
        td["action"] = ["go"]
        await pool.async_step_send(td)
        assert (await raw.recv())["action"] == "go"
        await raw.send({"type": "log_returns", "episode_id": "e", "reward": float("nan")})
        assert "finite" in (await raw.recv())["message"]
        out = await pool.async_step_recv(min_get=1, timeout=WAIT)
        assert out["next", "truncated"].tolist() == [[True]]
        assert out["next", "info", "disconnected"].tolist() == [True]


async def test_the_client_hears_the_error_as_a_policy_server_error() -> None:
    server = aenvs.serve(1, TEXT, TEXT)
    async with server, server.pool(), AsyncPolicyClient(server.url) as client:
        eid = await client.start_episode()
        with pytest.raises(aenvs.PolicyServerError, match=r"refused a message.*does not fit"):
            await asyncio.wait_for(client.get_action(eid, "not text!"), WAIT)
        with pytest.raises(aenvs.PolicyServerError, match="refused a message"):
            await client.start_episode()  # every later call fails the same way
