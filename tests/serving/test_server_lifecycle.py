"""Starting and closing a server, its pool's executors and timeouts, bad arguments."""

from __future__ import annotations

import asyncio
import importlib
import sys
import threading

import psutil
import pytest

import aenvs
from aenvs import AsyncEnvPool, AsyncPolicyClient, EnvError, EnvTimeoutError, PolicyClient, PolicyServerError
from tests.serving.support import TEXT, WAIT, until


@pytest.mark.parametrize("executor", ["thread", "process", "ray"])
async def test_a_server_pool_on_another_executor_is_refused(executor: str) -> None:
    server = aenvs.serve(2, TEXT, TEXT)
    async with server:
        with pytest.raises(ValueError, match="only the inline executor"):
            server.pool(executor=executor)
        with pytest.raises((EnvError, TypeError), match='executor="inline"'):
            async with AsyncEnvPool(server.env_fns, executor=executor):
                pass
        async with server.pool() as pool:  # the server is unharmed
            assert pool.num_envs == 2


async def test_closing_the_server_with_clients_connected_leaves_nothing_running() -> None:
    tasks_before = asyncio.all_tasks()
    server = aenvs.serve(2, TEXT, TEXT)
    await server.start()
    port = server.port
    pool = await server.pool().start()
    acting, queued = AsyncPolicyClient(server.url), AsyncPolicyClient(server.url)
    try:
        await acting.start_episode("acting")
        holding = asyncio.create_task(acting.get_action("acting", "a0"))
        await pool.async_reset_send(env_index=[0])
        td = await pool.async_reset_recv(min_get=1, timeout=WAIT)
        td["action"] = ["go"]
        await pool.async_step_send(td)
        assert await asyncio.wait_for(holding, WAIT) == "go"
        await queued.start_episode("queued")
        waiting = asyncio.create_task(queued.get_action("queued", "q0"))
        failures: list[BaseException] = []

        def sync_client() -> None:
            with PolicyClient(server.url) as client:
                eid = client.start_episode()
                try:
                    client.get_action(eid, "s0")
                except PolicyServerError as exc:
                    failures.append(exc)

        thread = threading.Thread(target=sync_client)
        thread.start()
        await until(lambda: server.num_queued == 2)

        await asyncio.wait_for(server.aclose(), WAIT)

        with pytest.raises(PolicyServerError, match=r"closed.*1001 the EnvServer closed"):
            await asyncio.wait_for(waiting, WAIT)
        with pytest.raises(PolicyServerError, match="closed"):
            await acting.get_action("acting", "a1")
        await asyncio.to_thread(thread.join, WAIT)
        assert not thread.is_alive() and len(failures) == 1 and "closed" in str(failures[0])
        # the episode in a slot ends truncated; a slot waiting for one hears the server closed
        out = await pool.async_step_recv(min_get=1, timeout=WAIT)
        assert out["next", "truncated"].tolist() == [[True]]
        assert out["next", "info", "disconnected"].tolist() == [True]
        await pool.async_reset_send(env_index=[1])
        with pytest.raises(EnvError, match="the EnvServer closed"):
            await pool.async_reset_recv(min_get=1, timeout=WAIT)
    finally:
        await acting.close()
        await queued.close()
        await pool.aclose()
        await server.aclose()
    assert server.num_connections == 0 and server.num_open_episodes == 0
    await until(lambda: not asyncio.all_tasks() - tasks_before)
    sockets = [c for c in psutil.Process().net_connections("tcp") if port in (c.laddr[1:2] + c.raddr[1:2])]
    assert not sockets, sockets
    with pytest.raises(RuntimeError, match="closed"):
        await server.start()


async def test_a_client_idle_past_step_timeout_is_a_step_timeout_and_the_slot_serves_on() -> None:
    server = aenvs.serve(1, TEXT, TEXT)
    async with (
        server,
        server.pool(step_timeout=0.2, on_error="restart", restart_backoff=0.0) as pool,
        AsyncPolicyClient(server.url) as client,
    ):
        idle = await client.start_episode()
        holding = asyncio.create_task(client.get_action(idle, "i0"))
        td = await pool.reset()
        td["action"] = ["go"]
        await pool.async_step_send(td)
        assert await asyncio.wait_for(holding, WAIT) == "go"
        with pytest.raises(EnvTimeoutError):  # the client never answers
            await pool.async_step_recv(min_get=1, timeout=WAIT)
        with pytest.raises(PolicyServerError, match=r"given up by the trainer.*step_timeout"):
            await asyncio.wait_for(client.get_action(idle, "i1"), WAIT)
        nxt = await client.start_episode()
        holding = asyncio.create_task(client.get_action(nxt, "n0"))
        td = await pool.reset()  # after the slot's restart
        assert td["info", "episode_id"].tolist() == [nxt]
        td["action"] = ["ok"]
        await pool.async_step_send(td)
        assert await asyncio.wait_for(holding, WAIT) == "ok"
        await client.end_episode(nxt, "n1")
        out = await pool.async_step_recv(min_get=1, timeout=WAIT)
        assert out["next", "terminated"].tolist() == [[True]]


async def test_a_reset_mid_episode_gives_the_episode_up() -> None:
    server = aenvs.serve(1, TEXT, TEXT)
    async with server, server.pool() as pool, AsyncPolicyClient(server.url) as client:
        first = await client.start_episode()
        waiting_first = asyncio.create_task(client.get_action(first, "f0"))
        td = await pool.reset()
        assert td["info", "episode_id"].tolist() == [first]
        second = await client.start_episode()
        waiting_second = asyncio.create_task(client.get_action(second, "s0"))
        td = await pool.reset()  # the trainer drops "first" for the next episode
        assert td["info", "episode_id"].tolist() == [second]
        with pytest.raises(PolicyServerError, match="reset its env in the middle"):
            await asyncio.wait_for(waiting_first, WAIT)
        td["action"] = ["go"]
        await pool.async_step_send(td)
        assert await asyncio.wait_for(waiting_second, WAIT) == "go"


def test_bad_arguments_are_refused_naming_them() -> None:
    with pytest.raises(ValueError, match="num_envs"):
        aenvs.serve(0, TEXT, TEXT)
    with pytest.raises(TypeError, match="observation_space"):
        aenvs.serve(1, "text", TEXT)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="port"):
        aenvs.serve(1, TEXT, TEXT, port=-1)
    with pytest.raises(RuntimeError, match="not started"):
        _ = aenvs.serve(1, TEXT, TEXT).url
    with pytest.raises(ValueError, match="url"):
        PolicyClient("http://127.0.0.1:1")
    with pytest.raises(TypeError, match="action_space"):
        AsyncPolicyClient("ws://127.0.0.1:1", action_space=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reward"):  # before connecting
        PolicyClient("ws://127.0.0.1:1").log_returns("e", "much")  # type: ignore[arg-type]
    with pytest.raises(PolicyServerError, match="cannot reach"):
        PolicyClient("ws://127.0.0.1:1").start_episode()


def test_without_websockets_the_import_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n.startswith("aenvs._serving")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "websockets", None)
    with pytest.raises(ImportError, match=r"aenvs\[serve\]"):
        importlib.import_module("aenvs._serving")
