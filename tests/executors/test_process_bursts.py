"""The process executor under bursts: nothing waits on a worker's socket on the loop's thread.

A command per env (the collector's resets, each with its task) sends thousands of messages
in one turn of the loop while the workers write large answers back; both directions must
drain however full the sockets are (issue 43).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import NonTensorStack, TensorDict

from aenvs import AsyncEnvPool
from aenvs.executors import ProcessExecutor
from tests.executors.chatty_envs import BLOB, ReaderEnv, make_chatty
from tests.helpers import Gate, actions, gated_env_fns


def _heads(blobs: Any) -> list[list[str]]:
    assert all(len(blob) == BLOB for blob in blobs)
    return [blob.split(":")[:3] for blob in blobs]


@pytest.mark.slow
async def test_a_burst_of_per_env_commands_with_large_answers_arrives_exactly_once() -> None:
    n = 4096
    async with AsyncEnvPool([make_chatty] * n, executor=ProcessExecutor(num_workers=2)) as pool:
        turned: list[bool] = []
        asyncio.get_running_loop().call_soon(turned.append, True)
        for i in range(n):  # a reset per env, each with its task, as the collector sends them
            await pool.async_reset_send(env_index=[i], options={"task": f"t{i}"})
        assert not turned, "the resets did not go out in one turn of the loop"
        out = await pool.async_reset_recv(min_get=n)
        assert out["env_index"].tolist() == list(range(n))
        assert _heads(out["info", "blob"]) == [[str(i), "1", f"t{i}"] for i in range(n)]

        action = TensorDict({"action": torch.zeros(1, dtype=torch.int64)}, batch_size=[1])
        for i in range(n):  # a step per env
            await pool.async_step_send(action, env_index=[i])
        assert len(turned) == 1, "the steps did not go out in one turn of the loop"
        out = await pool.async_step_recv(min_get=n)
        assert out["env_index"].tolist() == list(range(n))
        assert _heads(out["next", "info", "blob"]) == [[str(i), "2", f"t{i}"] for i in range(n)]

        # nothing more comes: every env answered each command once
        assert (await pool.async_step_recv(min_get=0)).batch_size == (0,)
        assert (await pool.async_reset_recv(min_get=0)).batch_size == (0,)
        assert await pool.get_attr("answers") == [2] * n


async def test_the_loop_runs_while_a_busy_worker_cannot_take_its_commands(tmp_path) -> None:
    """Commands larger than the socket takes go to a worker stuck in a step until a task on
    the loop opens its gate: a send that waited for the worker would wait forever."""
    gate = Gate(str(tmp_path))
    async with AsyncEnvPool(gated_env_fns(4, gate), executor=ProcessExecutor(num_workers=1)) as pool:
        await pool.reset()
        await pool.async_step_send(actions([1.0]), env_index=[0])  # its worker waits for the gate
        opened = asyncio.Event()

        async def open_gate() -> None:
            gate.open()
            opened.set()

        opener = asyncio.create_task(open_gate())
        big = {"ballast": "x" * 4_000_000}
        for i in (1, 2, 3):  # 12 MB for the busy worker, in one turn of the loop
            await pool.async_reset_send(env_index=[i], options=big)
        await opened.wait()  # the loop ran the task while the worker could not read
        await opener
        step = await pool.async_step_recv(env_index=[0])
        assert step["next", "observation"][:, 1].tolist() == [1.0]
        resets = await pool.async_reset_recv(min_get=3)
        assert resets["env_index"].tolist() == [1, 2, 3]


def test_waiting_outside_the_loop_sends_what_the_socket_did_not_take(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    """The sync shim waits for answers in the executor while the loop does not run: what a
    send left for the loop to write (commands larger than the socket takes) goes out there."""
    loop = loop_factory()
    executor = ProcessExecutor(num_workers=1)
    pool = AsyncEnvPool([ReaderEnv] * 2, executor=executor)
    try:
        loop.run_until_complete(pool.start())
        td = loop.run_until_complete(pool.reset())
        td["action"] = NonTensorStack("a" * 3_000_000, "b" * 2_000_000)
        loop.run_until_complete(pool.async_step_send(td))  # most of it waits to go out
        executor.wait_outside_loop(30.0)
        assert sorted(c.env_index for c in executor.poll()) == [0, 1]  # answered, the loop idle
        buffers = executor.buffers
        assert buffers is not None
        lengths = [buffers.rows(i).step[("observation",)].tolist() for i in (0, 1)]
        assert lengths == [[3_000_000.0], [2_000_000.0]]
    finally:
        loop.run_until_complete(pool.aclose())
        loop.close()
