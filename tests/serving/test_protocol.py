"""Messages that break the protocol: the client gets an error and its connection closes;
the server and the pool carry on."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from gymnasium import spaces

import aenvs
from aenvs import AsyncPolicyClient
from tests.serving.support import TEXT, WAIT, RawClient, policy, until
from tests.serving.test_many_clients import run_client

START = {"type": "start_episode", "episode_id": "e"}
ASK = {"type": "get_action", "episode_id": "e", "observation": "x"}
DEEP = "[" * 100_000 + "]" * 100_000  # past the JSON parser's recursion limit
DEEPISH = "[" * 900 + "]" * 900  # within it
DIGITS = "7" * 400  # beyond any float; 5,000 digits are beyond what Python reads as an int

BAD: dict[str, tuple[list[dict[str, Any]], dict[str, Any] | str | bytes, str]] = {
    "not json": ([], "{nope", "not valid JSON"),
    "not an object": ([], "[1]", 'JSON object with a "type"'),
    "binary": ([], b"\x00", "binary frame"),
    "unknown type": ([], {"type": "fly", "episode_id": "e"}, "unknown message type 'fly'"),
    "unknown type without an episode id": ([], {"type": "fly"}, "unknown message type 'fly'"),
    "type not a string": ([], {"type": 5, "episode_id": "e"}, 'JSON object with a "type"'),
    "null": ([], "null", 'JSON object with a "type", got None'),
    "a bare string": ([], '"start_episode"', 'JSON object with a "type"'),
    "episode id not a string": ([], {"type": "start_episode", "episode_id": ["e"]}, '"episode_id" string'),
    "nested too deeply": ([], f'{{"type": "start_episode", "episode_id": "e", "x": {DEEP}}}', "deeper than"),
    "observation nested deeply": (
        [START],
        f'{{"type": "get_action", "episode_id": "e", "observation": {DEEPISH}}}',
        "does not fit",
    ),
    "an integer of 5,000 digits": (
        [],
        f'{{"type": "start_episode", "episode_id": {"7" * 5000}}}',
        "4300 digits",
    ),
    "a reward of 400 digits": (
        [START],
        f'{{"type": "log_returns", "episode_id": "e", "reward": {DIGITS}}}',
        "finite",
    ),
    "an observation of 400 digits": (
        [START],
        f'{{"type": "get_action", "episode_id": "e", "observation": {DIGITS}}}',
        "does not fit",
    ),
    "info nested too deeply": (
        [START],
        f'{{"type": "log_returns", "episode_id": "e", "reward": 1, "info": {{"x": {DEEPISH}}}}}',
        "nests more than 32",
    ),
    "info with an integer beyond 64 bits": (
        [START],
        {"type": "log_returns", "episode_id": "e", "reward": 1, "info": {"n": [1, 2**63]}},
        "beyond 64 bits",
    ),
    "info with an integer of 400 digits": (
        [START],
        f'{{"type": "log_returns", "episode_id": "e", "reward": 1, "info": {{"n": {DIGITS}}}}}',
        "beyond 64 bits",
    ),
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
async def test_a_message_breaking_the_protocol_closes_its_connection_only(
    case: str, caplog: pytest.LogCaptureFixture
) -> None:
    before, bad, error = BAD[case]
    caplog.set_level(logging.ERROR, logger="websockets")
    server = aenvs.serve(1, TEXT, TEXT)
    async with server, server.pool() as pool, AsyncPolicyClient(server.url) as good:
        raw = await RawClient.connect(server.url)
        for message in before:
            await raw.send(message)
        await raw.send(bad)
        answer = await raw.recv()
        assert answer["type"] == "error" and error in answer["message"], answer
        assert len(answer["message"]) < 400, answer  # what the client sent is quoted briefly
        assert (await raw.closed())[0] == 1008
        await until(lambda: server.num_connections == 1 and server.num_open_episodes == 0)
        assert not caplog.records, caplog.text  # no handler died with a traceback
        # the server and the pool go on
        task = asyncio.create_task(run_client(good, "good", [(1, False)]))
        td = await pool.reset()
        td["action"] = [policy("good-0-0")]
        out = await pool.step(td)
        assert out["next", "terminated"].tolist() == [[True]]
        await asyncio.wait_for(task, WAIT)


SPACES = {
    "Box": spaces.Box(-1, 1, (2,)),
    "Discrete": spaces.Discrete(3),
    "MultiDiscrete": spaces.MultiDiscrete([2, 3]),
    "Dict": spaces.Dict({"n": spaces.Discrete(3), "x": spaces.Box(-1, 1, (1,))}),
}
NO_SAMPLE = {
    "400 digits": DIGITS,
    "beyond 64 bits": str(2**64),
    "nested deeply": DEEPISH,
    "an object": '{"n": {"n": 1}}',
    "null": "null",
}


@pytest.mark.parametrize("value", list(NO_SAMPLE))
@pytest.mark.parametrize("space", list(SPACES))
async def test_an_observation_no_space_can_hold_is_refused(
    space: str, value: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="websockets")
    server = aenvs.serve(1, SPACES[space], spaces.Discrete(2))
    async with server:
        raw = await RawClient.connect(server.url)
        await raw.send(START)
        await raw.send(f'{{"type": "get_action", "episode_id": "e", "observation": {NO_SAMPLE[value]}}}')
        answer = await raw.recv()
        assert answer["type"] == "error" and "observation" in answer["message"], answer
        assert (await raw.closed())[0] == 1008
        await until(lambda: server.num_connections == 0 and server.num_open_episodes == 0)
    assert not caplog.records, caplog.text


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
        with pytest.raises(aenvs.PolicyServerError, match=r"closed this client.s connection: .*does not fit"):
            await asyncio.wait_for(client.get_action(eid, "not text!"), WAIT)
        with pytest.raises(aenvs.PolicyServerError, match=r"closed this client.s connection"):
            await client.start_episode()  # every later call fails the same way


async def test_a_text_frame_that_is_not_utf8_closes_its_connection_with_the_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="websockets")
    server = aenvs.serve(1, TEXT, TEXT)
    async with server, server.pool() as pool, AsyncPolicyClient(server.url) as good:
        raw = await RawClient.connect(server.url)
        await raw.send(START)
        await raw.ws.send(b'{"type": "log_returns", "episode_id": "e", "info": "\xff"}', text=True)
        code, reason = await raw.closed()
        assert code == 1007 and reason is not None and "invalid start byte" in reason, (code, reason)
        await until(lambda: server.num_connections == 1 and server.num_open_episodes == 0)
        assert not caplog.records, caplog.text
        task = asyncio.create_task(run_client(good, "good", [(1, False)]))
        td = await pool.reset()
        td["action"] = [policy("good-0-0")]
        out = await pool.step(td)
        assert out["next", "terminated"].tolist() == [[True]]
        await asyncio.wait_for(task, WAIT)
