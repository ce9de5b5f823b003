"""Who may connect: a server with a token refuses every client without it (HTTP 401, before
the websocket opens, so nothing reaches the pool); TLS; a non-loopback host needs a token."""

from __future__ import annotations

import asyncio
import ssl

import pytest
from websockets.exceptions import InvalidStatus

import aenvs
from aenvs import AsyncPolicyClient, PolicyClient, PolicyServerError
from aenvs._serving.auth import TOKEN_ENV
from tests.serving.conftest import Certificate
from tests.serving.support import TEXT, WAIT, RawClient, train
from tests.serving.test_many_clients import run_client

TOKEN = "Zq3-7vN_x1t9Jr0s-token"
CLIENTS = {"async": AsyncPolicyClient, "sync": PolicyClient}


async def play_one(server: aenvs.EnvServer, client: AsyncPolicyClient | PolicyClient) -> None:
    """One client episode of two steps, run through the server's pool: the client sees the
    trainer's actions and the trainer every step."""
    async with server.pool() as pool:
        task = asyncio.create_task(run_client(client, "ok", [(2, False)]))
        try:
            trained = await train(pool, 1)
        except BaseException:
            task.cancel()  # the client's own failure, if any, is what the test reports
            raise
        async with asyncio.timeout(WAIT):
            sent = await task
    assert trained.steps == sent


async def close(client: AsyncPolicyClient | PolicyClient) -> None:
    if isinstance(client, PolicyClient):
        await asyncio.to_thread(client.close)
    else:
        await client.close()


@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_a_client_with_the_token_plays(kind: str) -> None:
    server = aenvs.serve(1, TEXT, TEXT, token=TOKEN)
    async with server:
        client = CLIENTS[kind](server.url, token=TOKEN)
        try:
            await play_one(server, client)
        finally:
            await close(client)


@pytest.mark.parametrize("kind", list(CLIENTS))
@pytest.mark.parametrize(
    ("token", "why"),
    [
        (None, "this server requires a token"),
        ("not-the-token", "the token this client sent is not this server's"),
    ],
)
async def test_a_client_without_the_token_is_refused_before_anything_reaches_the_pool(
    kind: str, token: str | None, why: str
) -> None:
    server = aenvs.serve(1, TEXT, TEXT, token=TOKEN)
    async with server, server.pool() as pool:
        client = CLIENTS[kind](server.url, token=token)
        try:
            with pytest.raises(PolicyServerError, match=rf"refused this client \(HTTP 401\): {why}"):
                await asyncio.wait_for(run_client(client, "intruder", [(1, False)]), WAIT)
        finally:
            await close(client)
        assert server.num_connections == 0 and server.num_open_episodes == 0 and server.num_queued == 0
        # the pool never saw it, and serves the next client with the token
        good = AsyncPolicyClient(server.url, token=TOKEN)
        task = asyncio.create_task(run_client(good, "good", [(1, False)]))
        trained = await train(pool, 1)
        async with asyncio.timeout(WAIT):
            assert trained.steps == await task
        await good.close()


@pytest.mark.parametrize(
    "headers",
    [
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": TOKEN},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
    ],
    ids=["another scheme", "no scheme", "longer", "shorter"],
)
async def test_a_handshake_with_anything_but_the_bearer_token_gets_401(headers: dict[str, str]) -> None:
    server = aenvs.serve(1, TEXT, TEXT, token=TOKEN)
    async with server:
        with pytest.raises(InvalidStatus) as refused:
            await RawClient.connect(server.url, headers=headers)
        response = refused.value.response
        assert response.status_code == 401
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
        assert b"not this server's" in response.body
        raw = await RawClient.connect(server.url, headers={"Authorization": f"Bearer {TOKEN}"})
        await raw.ws.close()


async def test_the_token_is_read_from_the_environment_on_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, f"  {TOKEN}\n")  # as `export X=$(cat file)` may leave it
    server = aenvs.serve(1, TEXT, TEXT)
    assert server.requires_token
    async with server:
        with pytest.raises(InvalidStatus):
            await RawClient.connect(server.url)
        client = AsyncPolicyClient(server.url)
        try:
            await play_one(server, client)
        finally:
            await client.close()


def test_bad_tokens_are_refused_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="token must not be empty"):
        aenvs.serve(1, TEXT, TEXT, token="")
    with pytest.raises(ValueError, match="printable ASCII without spaces"):
        PolicyClient("ws://127.0.0.1:1", token="two words")
    with pytest.raises(TypeError, match="token must be a str"):
        AsyncPolicyClient("ws://127.0.0.1:1", token=1234)  # type: ignore[arg-type]
    monkeypatch.setenv(TOKEN_ENV, "tok\u00e9n")
    with pytest.raises(ValueError, match=f"{TOKEN_ENV} must be printable ASCII"):
        aenvs.serve(1, TEXT, TEXT)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "192.168.1.7", "trainer.example"])
def test_a_non_loopback_host_needs_a_token_or_insecure(host: str) -> None:
    with pytest.raises(
        ValueError, match=r"not a loopback address and the server has no token.*insecure=True"
    ):
        aenvs.serve(1, TEXT, TEXT, host=host)
    assert aenvs.serve(1, TEXT, TEXT, host=host, token=TOKEN).requires_token
    assert not aenvs.serve(1, TEXT, TEXT, host=host, insecure=True).requires_token


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost"])
def test_a_loopback_host_needs_no_token(host: str) -> None:
    assert not aenvs.serve(1, TEXT, TEXT, host=host).requires_token


@pytest.mark.parametrize("kind", list(CLIENTS))
async def test_tls_with_a_certificate_made_here(kind: str, certificate: Certificate) -> None:
    server = aenvs.serve(1, TEXT, TEXT, token=TOKEN, ssl=certificate.server)
    async with server:
        assert server.url.startswith("wss://127.0.0.1:")
        client = CLIENTS[kind](server.url, token=TOKEN, ssl=certificate.client)
        try:
            await play_one(server, client)
        finally:
            await close(client)
        # over TLS, a wrong token is still a 401
        refused = CLIENTS[kind](server.url, token="wrong", ssl=certificate.client)
        with pytest.raises(PolicyServerError, match=r"HTTP 401"):
            await asyncio.wait_for(run_client(refused, "x", [(1, False)]), WAIT)
        await close(refused)
        assert server.num_connections == 0


async def test_a_client_that_does_not_trust_the_certificate_or_skips_tls_cannot_connect(
    certificate: Certificate,
) -> None:
    server = aenvs.serve(1, TEXT, TEXT, token=TOKEN, ssl=certificate.server)
    async with server:
        untrusting = AsyncPolicyClient(server.url, token=TOKEN, ssl=ssl.create_default_context())
        with pytest.raises(PolicyServerError, match=r"cannot reach wss://.*CERTIFICATE_VERIFY_FAILED"):
            await untrusting.connect()
        plain = AsyncPolicyClient(server.url.replace("wss://", "ws://"), token=TOKEN)
        with pytest.raises(PolicyServerError, match="cannot reach ws://"):
            await plain.connect()
        assert server.num_connections == 0
    with pytest.raises(ValueError, match=r"ssl= is for a wss:// address"):
        PolicyClient("ws://127.0.0.1:1", ssl=certificate.client)
    with pytest.raises(TypeError, match=r"ssl must be an ssl\.SSLContext"):
        aenvs.serve(1, TEXT, TEXT, ssl="cert.pem")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ssl is a client context"):
        aenvs.serve(1, TEXT, TEXT, ssl=certificate.client)
    assert certificate.server.num_tickets == 0  # turned off by the servers above
